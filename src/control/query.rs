//! The query of an admin URL (`/route?key=…`, `/ready?digest=…`): values by
//! name, percent-decoded. For the admin listener and `/route` alike.

/// The value of `name` in a URL query (`a=1&b=2`), percent-decoded; `None`
/// when it is not there or does not decode.
pub(crate) fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(key, _)| *key == name)
        .and_then(|(_, value)| percent_decode(value))
        .and_then(|bytes| String::from_utf8(bytes).ok())
}

/// `text` with `%XX` escapes decoded; `None` on a bad escape. A `+` stays a
/// `+` (it is a space only in HTML forms, and no key has a space).
pub(crate) fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::{percent_decode, query_value};

    #[test]
    fn query_values_are_percent_decoded_and_bad_escapes_refused() {
        let query = Some("digest=00ff&key=a%20b%2Bc+d&empty");
        assert_eq!(query_value(query, "digest").as_deref(), Some("00ff"));
        assert_eq!(query_value(query, "key").as_deref(), Some("a b+c+d"));
        assert_eq!(query_value(query, "empty").as_deref(), Some(""));
        assert_eq!(query_value(query, "missing"), None);
        assert_eq!(query_value(None, "key"), None);
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%+1"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%00%ff").unwrap(), [0, 255]);
    }
}
