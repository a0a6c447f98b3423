//! A namespace made with a setup run inside it by the thread that made it
//! (`Netns::with_label_setup`: how a lab makes its pods' namespaces, with
//! `lo` up and ping sockets allowed, at one thread a pod): what the setup did
//! is there when read from outside; a setup that fails leaves no namespace
//! behind and says why.

use cnilab_net::netns::{self, Netns};
use cnilab_tests::{host_untouched, require_root};

const PING: &str = "net/ipv4/ping_group_range";

fn own_namespaces_labelled(label: &str) -> Vec<String> {
    let own = format!("{}{}-", netns::PREFIX, std::process::id());
    std::fs::read_dir(netns::NETNS_DIR)
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&own) && n.ends_with(label))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn setup_runs_inside_the_new_namespace() {
    require_root();
    let _host = host_untouched();
    let inside = || {
        netns::lo_up_here()?;
        netns::write_sysctl(None, PING, "0 2147483647")
    };
    let ns = Netns::with_label_setup("t-setup", &inside).expect("namespace with setup");
    let links = ns.links().expect("links");
    let lo = links.iter().find(|l| l.name == "lo").expect("lo");
    assert!(lo.up, "lo is down in {}: {links:?}", ns.name());
    let range = netns::read_sysctl(Some(ns.file()), PING).expect("read sysctl");
    assert_eq!(
        range.split_whitespace().collect::<Vec<_>>(),
        ["0", "2147483647"]
    );
    // A namespace made without the setup starts as every new one does.
    let plain = Netns::with_label("t-plain").expect("plain namespace");
    let plain_links = plain.links().expect("links");
    assert!(plain_links.iter().any(|l| l.name == "lo" && !l.up));
    let plain_range = netns::read_sysctl(Some(plain.file()), PING).expect("read sysctl");
    assert_ne!(
        plain_range.split_whitespace().collect::<Vec<_>>(),
        ["0", "2147483647"]
    );
}

#[test]
fn a_failed_setup_leaves_no_namespace_and_says_why() {
    require_root();
    let _host = host_untouched();
    let refuse = || Err(std::io::Error::other("refused by the test"));
    let err = Netns::with_label_setup("t-setupno", &refuse).expect_err("setup fails");
    let text = err.to_string();
    assert!(text.contains("refused by the test"), "{text}");
    assert!(text.contains("t-setupno"), "{text}");
    assert_eq!(own_namespaces_labelled("-t-setupno"), Vec::<String>::new());
    // A bad label is refused before anything is made.
    assert!(Netns::with_label_setup("no/slash", &refuse).is_err());
}
