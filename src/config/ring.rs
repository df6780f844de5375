//! `ring`, `hash`, `hash_tag` and `hash_without_prefix`: which ring to
//! reproduce and how keys are hashed onto it.

use std::ops::Range;

use super::raw::RawConfig;
use crate::error::ConfigError;
use crate::ring::{Flavour, HashFunction, Spec};

/// `ring`, `hash`, `hash_tag` and `hash_without_prefix`: which ring to
/// reproduce and how keys are hashed onto it.
pub(super) fn ring_spec(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<Spec, ConfigError> {
    let mut spec = Spec::default();
    if let Some(name) = &raw.ring {
        spec.flavour = Flavour::from_name(name.get_ref()).ok_or_else(|| {
            let known: Vec<&str> = Flavour::ALL.iter().map(|f| f.name()).collect();
            at(
                name.span(),
                format!(
                    "ring = \"{}\" is not a ring flavour (one of: {})",
                    name.get_ref(),
                    known.join(", ")
                ),
            )
        })?;
    }
    if spec.flavour == Flavour::PhpMemcache {
        // PHP's memcache.hash_function names, crc32 by default as in PHP.
        spec.hash = match raw.hash.as_ref().map(|n| n.get_ref().as_str()) {
            None | Some("crc32") => HashFunction::Crc32a,
            Some("fnv") => HashFunction::Fnv1a32,
            Some(other) => {
                let span = raw.hash.as_ref().map(|n| n.span()).unwrap_or_default();
                return Err(at(
                    span,
                    format!(
                        "ring = \"php-memcache\" takes memcache.hash_function's names: hash = \"crc32\" or \"fnv\", not \"{other}\""
                    ),
                ));
            }
        };
    } else if let Some(name) = &raw.hash {
        let function = HashFunction::from_name(name.get_ref()).ok_or_else(|| {
            let known: Vec<&str> = HashFunction::ALL.iter().map(|f| f.name()).collect();
            at(
                name.span(),
                format!(
                    "hash = \"{}\" is not a hash function (one of: {})",
                    name.get_ref(),
                    known.join(", ")
                ),
            )
        })?;
        match spec.flavour {
            Flavour::Twemproxy => spec.hash = function,
            Flavour::Libmemcached if function == HashFunction::Md5 => {}
            Flavour::Libmemcached => {
                return Err(at(
                    name.span(),
                    "ring = \"libmemcached\" hashes keys with md5 only".into(),
                ))
            }
            Flavour::Dalli => {
                return Err(at(
                    name.span(),
                    "ring = \"dalli\" hashes keys with crc32 as Dalli does; hash does not apply"
                        .into(),
                ))
            }
            Flavour::Rendezvous => {
                return Err(at(
                    name.span(),
                    "ring = \"rendezvous\" scores keys with murmur3_32 as pymemcache's HashClient does; hash does not apply"
                        .into(),
                ))
            }
            Flavour::PhpMemcache => {} // read above, with PHP's names
            Flavour::Memring => {
                return Err(at(
                    name.span(),
                    "hash applies to ring = \"twemproxy\" (the memring ring always uses xxh3)"
                        .into(),
                ))
            }
        }
    }
    if let Some(tag) = &raw.hash_tag {
        let bytes = tag.get_ref().as_bytes();
        match bytes {
            [open, close] if bytes.iter().all(|b| b.is_ascii_graphic()) => {
                spec.hash_tag = Some([*open, *close]);
            }
            _ => {
                return Err(at(
                    tag.span(),
                    format!(
                    "hash_tag = \"{}\" must be two printable ASCII characters, such as \"{{}}\"",
                    tag.get_ref()
                ),
                ))
            }
        }
    }
    if let Some(prefix) = &raw.hash_without_prefix {
        spec.hash_without_prefix = prefix_of(prefix.get_ref())
            .map_err(|why| at(prefix.span(), why))?
            .into();
    }
    Ok(spec)
}

/// `hash_without_prefix`: the bytes a client puts before every key after
/// hashing it (pymemcache's `key_prefix`). It is part of every key sent, so
/// it must be something a key may hold: 1 to 250 bytes, no space or
/// control byte.
fn prefix_of(text: &str) -> Result<&[u8], String> {
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return Err(
            "hash_without_prefix = \"\" strips nothing: remove it, or give the clients' key_prefix"
                .into(),
        );
    }
    if bytes.len() > crate::protocol::MAX_KEY_BYTES {
        return Err(format!(
            "hash_without_prefix is {} bytes; a key, prefix included, holds at most {}",
            bytes.len(),
            crate::protocol::MAX_KEY_BYTES
        ));
    }
    if bytes.iter().any(|&b| b <= b' ' || b == 0x7f) {
        return Err(format!(
            "hash_without_prefix = {text:?} holds a space or control character, which no key may hold"
        ));
    }
    Ok(bytes)
}

/// A ring whose client has no weights (`ring = "rendezvous"`: pymemcache's
/// `HashClient` gives every server an equal share) refuses a server weight
/// other than 1, which it could not honour without moving keys away from
/// where that client puts them.
pub(super) fn check_weights(
    raw: &RawConfig,
    spec: &Spec,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<(), ConfigError> {
    if spec.flavour.has_weights() {
        return Ok(());
    }
    for entry in &raw.servers {
        if let Some(weight) = &entry.get_ref().weight {
            if *weight.get_ref() != 1 {
                return Err(at(
                    weight.span(),
                    format!(
                        "ring = \"{}\" has no weights (pymemcache's HashClient gives every server an equal share): remove weight = {}",
                        spec.flavour.name(),
                        weight.get_ref()
                    ),
                ));
            }
        }
    }
    Ok(())
}
