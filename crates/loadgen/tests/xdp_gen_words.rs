//! `slipstream-loadgen xdp-gen --word-templates`: the live-frame generator's round-robin word
//! templates must send exactly the multiset it writes to `--expect-counts`. A veth pair whose
//! client end lives in a network namespace this test creates (and deletes); the server end, in
//! this namespace, runs the XDP word-count engine (slipstream-fastpath `stream`), and what that
//! engine counted must equal the generator's file, word for word. Needs root (namespaces, BPF);
//! prints why and skips otherwise.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use slipstream_fastpath::stream::{StreamCfg, StreamKernel, OP_WORDCOUNT};

mod common;
use common::field_u64 as field;

const PORT: u16 = 23611;

/// `{"w1":3,"w0":7}` (the generator's flat map) as word -> count.
fn parse_counts(text: &str) -> BTreeMap<Vec<u8>, u64> {
    let body = text.trim().trim_start_matches('{').trim_end_matches('}');
    body.split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once(':').unwrap_or_else(|| panic!("bad entry {kv:?}"));
            (k.trim_matches('"').as_bytes().to_vec(), v.parse().unwrap_or_else(|_| panic!("bad count {v:?}")))
        })
        .collect()
}

#[test]
fn round_robin_word_templates_are_the_multiset_the_xdp_engine_counts() {
    let Some(net) = common::veth("ssg", None) else { return };
    let cli = net.cli.clone();
    let attach = StreamKernel::attach(&net.srv).expect("attach the XDP stream engine");
    let cfg = StreamCfg {
        op: OP_WORDCOUNT,
        window_ns: u64::MAX / 4,
        word_bytes_max: 32,
        records_max: 65_536,
        ..Default::default()
    };
    attach.kernel.add_stream(0, PORT, cfg).expect("add stream");
    let mac = std::fs::read_to_string(format!("/sys/class/net/{}/address", net.srv)).expect("server MAC");
    let expect = std::env::temp_dir().join(format!("xdp-gen-expect-{}.json", std::process::id()));
    let expect_s = expect.to_string_lossy().into_owned();
    // 997 frames over 7 templates: not a whole number of rounds, so the remainder's share is
    // checked too. Paced in bursts of 8 so the veth's 256-frame ring never overflows.
    let frames = 997u64;
    let port = PORT.to_string();
    let out = Command::new("ip")
        .args(["netns", "exec", &net.ns, env!("CARGO_BIN_EXE_slipstream-loadgen"), "xdp-gen", "--iface", &cli])
        .args(["--dst-mac", mac.trim(), "--src", "10.213.0.2", "--dst", "10.213.0.1", "--dport", &port])
        .args(["--word-templates", "7", "--vocabulary", "50", "--seed", "11", "--records-per-datagram", "16"])
        .args(["--rate-per-s", "5000", "--burst", "8", "--count", &frames.to_string(), "--warmup-s", "0"])
        .args(["--duration-s", "30", "--expect-counts", &expect_s])
        .output()
        .expect("run xdp-gen");
    let json = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "xdp-gen failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(field(&json, "sent_total"), frames, "{json}");
    assert_eq!(field(&json, "frames_built"), frames, "one program run per frame: {json}");
    assert_eq!(field(&json, "templates"), 7, "{json}");
    let want = parse_counts(&std::fs::read_to_string(&expect).expect("expect-counts file"));
    let _ = std::fs::remove_file(&expect);
    assert_eq!(want.values().sum::<u64>(), frames * 16);
    assert_eq!(field(&json, "records"), frames * 16, "{json}");
    assert!(want.len() > 7, "Zipf words, not one template's: {want:?}");

    // The veth delivers asynchronously (its NAPI thread): wait until every frame is counted.
    let mut st = attach.kernel.stats(0).expect("stats");
    for _ in 0..100 {
        if st.datagrams + st.passed >= frames {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        st = attach.kernel.stats(0).expect("stats");
    }
    assert_eq!((st.datagrams, st.passed, st.malformed), (frames, 0, 0), "every frame consumed by the engine");
    let (drained, err) = attach.kernel.drain_wordcount(0, u64::MAX);
    assert!(err.is_none(), "{err:?}");
    let mut got: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for (_, w, n) in drained {
        *got.entry(w).or_default() += n;
    }
    assert_eq!(got, want, "the engine's counts are the generator's multiset");
    drop(attach);
    drop(net);
}
