//! Tests of the kernel's account of a probe: the lines tracefs prints,
//! the probe followed through them, a trace's own part of a shared
//! instance, and the instances `sweep` may remove.

use super::*;

/// Recorded on this kernel (6.18): a ping of 133 bytes from spA to spB
/// through veths, dropped by an nft input rule in spB, in the event's
/// own format, then with raw fields (`options/fields`), then with
/// pointers unhashed (`options/hash-ptr` 0). The reply of a probe that
/// arrived, freed by ping_rcv, comes after the arrival.
const OWN: &[&str] = &[
    "            ping-5017    [001] b.s1.  1617.287921: net_dev_queue: dev=spa skbaddr=00000000db09e15f len=147",
    "            ping-5017    [001] ..s1.  1617.287927: netif_receive_skb: dev=spb skbaddr=00000000db09e15f len=133",
    "            ping-5017    [001] ..s1.  1617.287936: kfree_skb: skbaddr=00000000db09e15f rx_sk=0000000000000000 protocol=2048 location=nft_do_chain+0x46f/0x690 reason: NETFILTER_DROP",
];
const FIELDS: &[&str] = &[
    "            ping-5035    [001] b....  1620.639949: net_dev_queue: skbaddr=0xffff8881723c2200 (-131385428008448) len=0x93 (147) name=spa",
    "            ping-5035    [001] ..s1.  1620.639959: netif_receive_skb: skbaddr=0xffff8881723c2200 (-131385428008448) len=0x85 (133) name=spb",
    "            ping-5035    [001] ..s1.  1620.639973: kfree_skb: skbaddr=0xffff8881723c2200 (-131385428008448) location=nft_do_chain+0x46f/0x690 (-2114198529) rx_sk=0x0 (0) protocol=0x800 (2048) reason=0xc (12)",
];

fn reasons() -> BTreeMap<u32, String> {
    reason_names(
        r#"print fmt: "skbaddr=%p rx_sk=%p protocol=%u location=%pS reason: %s", REC->skbaddr, REC->rx_sk, REC->protocol, REC->location, __print_symbolic(REC->reason, { 2, "NOT_SPECIFIED" }, { 3, "NO_SOCKET" }, { 12, "NETFILTER_DROP" }, { 16, "IP_RPFILTER" })"#,
    )
}

/// Both printed forms give the same records: the device crossings and
/// a drop with its reason by name and the function without offset.
#[test]
fn both_printed_forms_parse_to_devices_and_a_named_drop() {
    let names = reasons();
    assert_eq!(names.get(&12).map(String::as_str), Some("NETFILTER_DROP"));
    assert_eq!(names.len(), 4);
    for lines in [OWN, FIELDS] {
        let mut symbols = Symbols::new(&names);
        let records: Vec<Record> = lines
            .iter()
            .filter_map(|l| parse(l, &mut symbols))
            .collect();
        assert_eq!(records.len(), 3, "{lines:?}");
        let Record::Device { rx, dev, skb, .. } = &records[0] else {
            panic!("{records:?}");
        };
        assert_eq!((*rx, dev.as_str()), (false, "spa"));
        assert!(
            matches!(&records[1], Record::Device { rx: true, dev, skb: s, len: 133 } if dev == "spb" && s == skb)
        );
        assert_eq!(
            records[2],
            Record::Drop {
                skb: skb.clone(),
                reason: "NETFILTER_DROP".into(),
                function: "nft_do_chain".into()
            }
        );
    }
    let mut symbols = Symbols::new(&names);
    assert_eq!(parse("# tracer: nop", &mut symbols), None);
    assert_eq!(
        parse(
            "  ping-1 [000] ..... 1.0: consume_skb: skbaddr=00000000db09e15f",
            &mut symbols
        ),
        None
    );
}

/// A location printed as an address is the function it falls in,
/// from the kernel's symbols; a hashed pointer resolves to nothing and
/// is said to be one, with the value printed.
#[test]
fn a_raw_location_resolves_through_the_kernels_symbols() {
    let names = reasons();
    let mut symbols = Symbols {
        reasons: &names,
        kallsyms: Some(kallsyms(
            "0000000000000000 T hidden\nffffffff81fbdf90 T nft_do_chain\nffffffff81fbe620 t nft_do_chain_ipv4\nffffffff82000000 D some_data\n",
        )),
    };
    let line = "  ping-5 [000] ..s1. 1.0: kfree_skb: skbaddr=ffff8881040ad900 rx_sk=0000000000000000 protocol=2048 location=ffffffff81fbe3ff reason: NETFILTER_DROP";
    let Some(Record::Drop { function, .. }) = parse(line, &mut symbols) else {
        panic!("a drop");
    };
    assert_eq!(function, "nft_do_chain");
    assert_eq!(
        function_of("0xffffffff81fbe630", &mut symbols),
        "nft_do_chain_ipv4"
    );
    assert_eq!(
        function_of("00000000a1b2c3d4", &mut symbols),
        "hashed location 00000000a1b2c3d4"
    );
    let numeric = "  p-5 [000] ..s1. 1.0: kfree_skb: skbaddr=0x1 (1) location=0xffffffff81fbdf99 (1) rx_sk=0x0 (0) protocol=0x800 (2048) reason=0x10 (16)";
    let Some(Record::Drop {
        function, reason, ..
    }) = parse(numeric, &mut symbols)
    else {
        panic!("a drop");
    };
    assert_eq!(
        (function.as_str(), reason.as_str()),
        ("nft_do_chain", "IP_RPFILTER")
    );
}

fn function_of(location: &str, symbols: &mut Symbols) -> String {
    function(location, symbols)
}

/// The probe is followed from its source's device to the drop; a drop
/// of another skb, events of other packets before the probe left, and
/// a packet that left a device of the same name elsewhere, are not its.
/// An answer is followed back from where the probe arrived.
#[test]
fn the_probe_is_followed_to_its_drop_and_not_past_its_arrival() {
    let dev = |rx: bool, dev: &str, skb: &str| Record::Device {
        rx,
        dev: dev.into(),
        skb: skb.into(),
        len: 84,
    };
    let drop = |skb: &str, reason: &str| Record::Drop {
        skb: skb.into(),
        reason: reason.into(),
        function: "f".into(),
    };
    // Devices: a0 in pod, r0/r1 in node, b0 in dst; anything else: unknown.
    let place = |_: Option<&DeviceHop>, d: &str, _: bool, _: bool| match d {
        "a0" => Some("pod".to_string()),
        "r0" | "r1" => Some("node".to_string()),
        "b0" => Some("dst".to_string()),
        _ => None,
    };
    let records = vec![
        dev(true, "r0", "other"),
        // Another pod's a0 of the same name: its peer is none of ours.
        dev(false, "a0", "foreign"),
        dev(true, "x7", "foreign"),
        drop("foreign", "NETFILTER_DROP"),
        // Another packet of the probe's length queued on an a0, then
        // on a device of the walk: not received where it left.
        dev(false, "a0", "foreign2"),
        dev(false, "r1", "foreign2"),
        drop("other", "NO_SOCKET"),
        dev(false, "a0", "p"),
        dev(true, "r0", "p"),
        dev(true, "x9", "q"),
        drop("q", "QDISC_DROP"),
        drop("p", "IP_RPFILTER"),
    ];
    let f = follow(&records, ("pod", "dst"), place);
    assert!(!f.arrived);
    assert_eq!(f.devices.len(), 2, "{f:?}");
    let d = f.drop.expect("a drop");
    assert_eq!(d.describe(), "dropped in node on r0: IP_RPFILTER (f)");
    let arrived = vec![
        dev(false, "a0", "p"),
        dev(true, "r0", "p"),
        dev(false, "r1", "p"),
        dev(true, "b0", "p"),
        drop("p", "NO_SOCKET"),
    ];
    let f = follow(&arrived, ("pod", "dst"), place);
    assert!(f.arrived && f.drop.is_none(), "{f:?}");
    assert_eq!(f.devices.last().map(|h| h.namespace.as_str()), Some("dst"));
    // The answer, on the same skb address, dropped on its way back.
    let mut answered = arrived.clone();
    answered.truncate(4);
    answered.extend([
        dev(false, "b0", "p"),
        dev(true, "r1", "p"),
        drop("p", "NETFILTER_DROP"),
    ]);
    let f = follow(&answered, ("pod", "dst"), place);
    assert!(f.arrived && f.drop.is_none(), "{f:?}");
    let back = f.reply_drop.expect("the answer's drop");
    assert_eq!(back.describe(), "dropped in node on r1: NETFILTER_DROP (f)");
}

/// A trace reads what came after its own marker (not an earlier
/// trace's, nor one whose number only starts like its own), and of that
/// only its probe's crossings (received at its length, queued 14 bytes
/// longer) and every drop; a marker overwritten is `None`.
#[test]
fn a_trace_reads_its_own_probe_after_its_own_marker() {
    let text = [
        "  ping-1 [000] ..... 1.0: tracing_mark_write: cnilab-trace-1",
        "  ping-1 [000] ..... 1.1: netif_receive_skb: dev=a skbaddr=01 len=85",
        "  ping-1 [000] ..... 1.2: tracing_mark_write: cnilab-trace-12",
        "  ping-1 [000] ..... 1.3: tracing_mark_write: cnilab-trace-2",
        "  ping-1 [000] ..... 1.4: net_dev_queue: dev=b skbaddr=02 len=101",
        "  ping-1 [000] ..... 1.5: net_dev_queue: dev=c skbaddr=03 len=99",
        "  ping-1 [000] ..... 1.6: netif_receive_skb: dev=d skbaddr=02 len=87",
        "  ping-1 [000] ..... 1.7: netif_receive_skb: dev=e skbaddr=03 len=85",
        "  ping-1 [000] ..... 1.8: kfree_skb: skbaddr=02 protocol=2048 location=ip_error+0x1/0x2 reason: IP_INADDRERRORS",
        "",
    ]
    .join("\n");
    let after = after_marker(&text, "cnilab-trace-2").expect("the marker");
    let reasons = BTreeMap::new();
    let mut symbols = Symbols::new(&reasons);
    let mine: Vec<Record> = after
        .lines()
        .filter_map(|l| parse(l, &mut symbols))
        .filter(|r| of_length(r, 87))
        .collect();
    let devices: Vec<&str> = mine
        .iter()
        .filter_map(|r| match r {
            Record::Device { dev, .. } => Some(dev.as_str()),
            Record::Drop { .. } => None,
        })
        .collect();
    assert_eq!(devices, ["b", "d"], "{mine:?}");
    assert!(
        matches!(mine.last(), Some(Record::Drop { reason, .. }) if reason == "IP_INADDRERRORS")
    );
    // Trace 1 sees its own marker's text, trace 12 its own.
    assert!(after_marker(&text, "cnilab-trace-1").is_some_and(|a| a.contains("len=85\n")));
    assert!(after_marker(&text, "cnilab-trace-12")
        .is_some_and(|a| !a.contains("len=85\n  ping-1 [000] ..... 1.2")));
    assert_eq!(after_marker(&text, "cnilab-trace-3"), None);
}

/// Only names of cnilab's own form give a pid (another tool's
/// instance that starts with the prefix is never swept).
#[test]
fn an_instance_name_gives_its_pid_only_in_cnilabs_form() {
    assert_eq!(instance_pid("cnilab-4242-3"), Some(4242));
    assert_eq!(instance_pid("cnilab-4242"), Some(4242));
    assert_eq!(instance_pid("cnilab-lab-x"), None);
    assert_eq!(instance_pid("cnilab-42-x"), None);
    assert_eq!(instance_pid("perf-42"), None);
}
