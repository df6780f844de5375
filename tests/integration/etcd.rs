//! Membership in etcd (issue 49), against a real etcd started by the test.

use crate::common::etcd::Etcd;

#[test]
fn the_test_etcd_keeps_its_keys_across_a_restart() {
    let mut etcd = Etcd::start("keeps-keys");
    etcd.put(
        "/memring/t/members/a",
        r#"{"addr":"127.0.0.1:1","state":"ACTIVE"}"#,
    );
    etcd.restart();
    assert_eq!(
        etcd.get("/memring/t/members/a").as_deref(),
        Some(r#"{"addr":"127.0.0.1:1","state":"ACTIVE"}"#)
    );
    etcd.delete("/memring/t/members/a");
    assert_eq!(etcd.get("/memring/t/members/a"), None);
}
