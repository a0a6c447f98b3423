//! `cnilab-floor`: the cheapest ADD this machine can do, executed like a
//! plugin, so `cnilab bench` has a floor to measure plugins against. It is
//! not a plugin anyone should use: no IPAM, no bridge, no lock, no cache.
//!
//! ADD creates one veth pair whose pod end is made directly inside
//! `CNI_NETNS` under `CNI_IFNAME`, gives the pod end the config's
//! `addresses` (default one: `10.99.0.2/24`; IPv6 without DAD) and brings
//! both ends up, the addresses and the pod end's up sent together; DEL deletes the host end by name (its peer goes with it).
//! With `"bridge": NAME` the host end is made a port of that bridge in its
//! creation (the bridge is made, up, when missing): the cheapest ADD of a
//! bridge plugin, so the kernel's own cost of a bridge port can be told
//! apart from a plugin's.
//! Every other command answers VERSION's list. Errors are CNI error JSON.

use cnilab_net::naming::host_veth_name;
use cnilab_net::netns;
use cnilab_net::nl;
use ipnet::IpNet;
use serde_json::{json, Value};
use std::io::Read;

fn main() {
    let mut stdin = Vec::new();
    let _ = std::io::stdin().take(1 << 20).read_to_end(&mut stdin);
    let (out, code) = match run(&stdin) {
        Ok(out) => (out, 0),
        Err((code, msg)) => (
            json!({"cniVersion": "1.1.0", "code": code, "msg": msg}).to_string(),
            1,
        ),
    };
    println!("{out}");
    std::process::exit(code);
}

type Failure = (u32, String);

fn var(key: &str) -> Result<String, Failure> {
    std::env::var(key).map_err(|_| (4, format!("{key} is not set")))
}

fn run(stdin: &[u8]) -> Result<String, Failure> {
    let command = var("CNI_COMMAND")?;
    let conf: Value = if stdin.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(stdin).map_err(|e| (6, format!("config: {e}")))?
    };
    let version = conf["cniVersion"].as_str().unwrap_or("1.1.0").to_string();
    match command.as_str() {
        "ADD" => add(&conf, &version),
        "DEL" => del().map(|()| String::new()),
        "VERSION" => Ok(json!({"cniVersion": version,
            "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
        .to_string()),
        other => Err((
            4,
            format!("CNI_COMMAND {other:?}: the floor does ADD and DEL"),
        )),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (5, format!("tokio: {e}")))
}

fn kernel(what: &str) -> impl Fn(rtnetlink::Error) -> Failure + '_ {
    move |e| (100, format!("{what}: {e}"))
}

fn add(conf: &Value, version: &str) -> Result<String, Failure> {
    let (id, ifname, path) = (
        var("CNI_CONTAINERID")?,
        var("CNI_IFNAME")?,
        var("CNI_NETNS")?,
    );
    let addresses: Vec<IpNet> = match conf["addresses"].as_array() {
        Some(list) => list
            .iter()
            .map(|a| a.as_str().and_then(|s| s.parse().ok()))
            .collect::<Option<_>>()
            .ok_or((7, "addresses: expected CIDR strings".to_string()))?,
        None => vec![IpNet::from(
            ipnet::Ipv4Net::new([10, 99, 0, 2].into(), 24).map_err(|e| (7, e.to_string()))?,
        )],
    };
    let ns =
        netns::open_network_namespace(&path).map_err(|e| (4, format!("CNI_NETNS {path}: {e}")))?;
    let rt = runtime()?;
    let _entered = rt.enter();
    let host = netns::connect(None).map_err(|e| (100, format!("netlink: {e}")))?;
    let pod = netns::connect(Some(&ns)).map_err(|e| (100, format!("netlink in {path}: {e}")))?;
    let host_veth = host_veth_name(&id, &ifname);
    let bridge = match conf.get("bridge") {
        None => None,
        Some(Value::String(b)) if !b.is_empty() && b.len() < 16 && !b.contains('/') => {
            Some(b.clone())
        }
        Some(other) => {
            return Err((
                7,
                format!("bridge: expected an interface name, got {other}"),
            ))
        }
    };
    rt.block_on(async {
        let controller = match &bridge {
            Some(name) => Some(bridge_index(&host, name).await?),
            None => None,
        };
        host.link()
            .add(nl::veth_message(&host_veth, &ifname, &ns, None, controller))
            .execute()
            .await
            .map_err(kernel("create veth"))?;
        let link = nl::link_by_name(&pod, &ifname)
            .await
            .map_err(kernel("look up the pod end"))?
            .ok_or((100, format!("{ifname} did not arrive in {path}")))?;
        // The addresses and the link's up go out back to back on one
        // socket, as cnilab-bridge sends them: one round trip, not one each.
        let adds = addresses
            .iter()
            .map(|net| nl::add_address(&pod, link.index, *net));
        let (added, up) = futures_util::future::join(
            futures_util::future::join_all(adds),
            nl::set_up(&pod, link.index),
        )
        .await;
        for outcome in added {
            outcome.map_err(kernel("add address"))?;
        }
        up.map_err(kernel("set up"))?;
        let ips: Vec<Value> = addresses
            .iter()
            .map(|a| json!({"interface": 0, "address": a.to_string()}))
            .collect();
        Ok(json!({
            "cniVersion": version,
            "interfaces": [{"name": ifname, "mac": link.mac.unwrap_or_default(), "sandbox": path}],
            "ips": ips,
        })
        .to_string())
    })
}

/// The index of bridge `name`, made (up) when it is missing.
async fn bridge_index(host: &rtnetlink::Handle, name: &str) -> Result<u32, Failure> {
    if let Some(link) = nl::link_by_name(host, name)
        .await
        .map_err(kernel("look up the bridge"))?
    {
        return Ok(link.index);
    }
    match host
        .link()
        .add(rtnetlink::LinkBridge::new(name).up().build())
        .execute()
        .await
    {
        Ok(()) => {}
        // Made meanwhile by another ADD.
        Err(e) if nl::is_exists(&e) => {}
        Err(e) => return Err(kernel("create the bridge")(e)),
    }
    nl::link_by_name(host, name)
        .await
        .map_err(kernel("look up the bridge"))?
        .map(|l| l.index)
        .ok_or((100, format!("bridge {name} did not appear")))
}

fn del() -> Result<(), Failure> {
    let (id, ifname) = (var("CNI_CONTAINERID")?, var("CNI_IFNAME")?);
    let rt = runtime()?;
    let _entered = rt.enter();
    let host = netns::connect(None).map_err(|e| (100, format!("netlink: {e}")))?;
    rt.block_on(nl::delete_link_by_name(
        &host,
        &host_veth_name(&id, &ifname),
    ))
    .map(drop)
    .map_err(kernel("delete veth"))
}
