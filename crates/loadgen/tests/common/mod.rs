//! What the generator's integration tests share: a veth pair with its client end in a network
//! namespace the test creates (and deletes on drop, even on failure), and reading a field of
//! the generator's flat JSON line. Not for: anything but these tests.
#![allow(dead_code)] // each test file uses its own subset

use std::process::Command;

pub fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().map(|s| s.success()).unwrap_or(false)
}

/// The namespace and the veth pair; dropping deletes both (deleting the namespace removes the
/// client end, and with it its peer).
pub struct Net {
    pub ns: String,
    /// The server end, in this namespace.
    pub srv: String,
    /// The client end, in `ns`.
    pub cli: String,
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.srv]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// A veth pair named after `tag` (three letters) and this process, both ends up, with
/// `(server, client)` IPv4 addresses (/24) if given. `None` (and why, printed) when not root.
pub fn veth(tag: &str, addrs: Option<(&str, &str)>) -> Option<Net> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: not root (network namespaces, BPF)");
        return None;
    }
    let id = std::process::id() % 100_000;
    let net = Net { ns: format!("{tag}n{id}"), srv: format!("{tag}s{id}"), cli: format!("{tag}c{id}") };
    assert!(ip(&["netns", "add", &net.ns]), "ip netns add");
    assert!(ip(&["link", "add", &net.srv, "type", "veth", "peer", "name", &net.cli, "netns", &net.ns]), "veth pair");
    if let Some((srv_ip, cli_ip)) = addrs {
        assert!(ip(&["addr", "add", &format!("{srv_ip}/24"), "dev", &net.srv]), "server address");
        assert!(ip(&["-n", &net.ns, "addr", "add", &format!("{cli_ip}/24"), "dev", &net.cli]), "client address");
    }
    assert!(ip(&["link", "set", &net.srv, "up"]), "server end up");
    assert!(ip(&["-n", &net.ns, "link", "set", &net.cli, "up"]), "client end up");
    Some(net)
}

/// The text of a field of the flat JSON line (nested fields included), by name.
fn raw<'a>(json: &'a str, name: &str) -> &'a str {
    let pat = format!("\"{name}\":");
    let at = json.find(&pat).unwrap_or_else(|| panic!("no field {name} in {json}")) + pat.len();
    let rest = &json[at..];
    &rest[..rest.find([',', '}']).unwrap_or(rest.len())]
}

/// A numeric field of the flat JSON line, by name.
pub fn field(json: &str, name: &str) -> f64 {
    raw(json, name).parse().unwrap_or_else(|_| panic!("field {name} not a number in {json}"))
}

/// An integer field of the flat JSON line (exact: parsed as an integer, not through f64).
pub fn field_u64(json: &str, name: &str) -> u64 {
    raw(json, name).parse().unwrap_or_else(|_| panic!("field {name} not an integer in {json}"))
}
