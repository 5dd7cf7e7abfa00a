//! `slipstream-loadgen xdp-gen --number-templates N --step-at-frame F --step-by X`: the live-frame
//! generator's change-point series. Frames 0..F must carry the unshifted set and every frame
//! from F on the shifted one, and the reported `step_sent_mono_ns` must be a CLOCK_MONOTONIC
//! time no later than the first shifted datagram's arrival (it is read right before the call
//! that sends frame F). A veth pair whose client end lives in a network namespace this test
//! creates (and deletes); the server end, in this namespace, has an address, the do-nothing
//! XDP program, and a UDP socket that receives every frame through the kernel's stack. Needs root; prints why and skips
//! otherwise.

use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

mod common;
use common::field_u64 as field;

const PORT: u16 = 23612;
const SRV_IP: &str = "10.214.0.1";
const CLI_IP: &str = "10.214.0.2";

fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the one we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
fn number_templates_switch_sets_at_the_step_frame_and_report_its_send_time() {
    let Some(net) = common::veth("sss", Some((SRV_IP, CLI_IP))) else { return };
    let cli = net.cli.clone();
    // A veth takes its peer's XDP_TX frames only with an XDP program of its own.
    let pass = slipstream_fastpath::PassProgram::attach(&net.srv).expect("attach xdp_pass");
    let sock = UdpSocket::bind((SRV_IP, PORT)).expect("bind the server socket");
    sock.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    // Every datagram with its arrival time, in order (one flow over one veth keeps order).
    let reader = std::thread::spawn(move || {
        let mut got: Vec<(Vec<f64>, u64)> = Vec::new();
        let mut buf = [0u8; 2048];
        let mut idle = 0;
        // Bounded: ends after 3 s of silence or 100,000 datagrams.
        while idle < 15 && got.len() < 100_000 {
            match sock.recv(&mut buf) {
                Ok(n) => {
                    let at = mono_ns();
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let values = text.lines().map(|l| l.trim().parse::<f64>().expect("a number")).collect();
                    got.push((values, at));
                    idle = 0;
                }
                Err(_) => idle += 1,
            }
        }
        got
    });
    let mac = std::fs::read_to_string(format!("/sys/class/net/{}/address", net.srv)).expect("server MAC");
    // 600 frames, 9 templates per set, the step at frame 301 (inside a burst of 8, so the
    // stamp is of a call that also sends unshifted frames).
    let (frames, step) = (600u64, 301u64);
    let out = Command::new("ip")
        .args(["netns", "exec", &net.ns, env!("CARGO_BIN_EXE_slipstream-loadgen"), "xdp-gen", "--iface", &cli])
        .args(["--dst-mac", mac.trim(), "--src", CLI_IP, "--dst", SRV_IP, "--dport", &PORT.to_string()])
        .args(["--number-templates", "9", "--records-per-datagram", "4", "--mean", "10", "--stddev", "1"])
        .args(["--decimals", "6", "--seed", "3", "--step-at-frame", &step.to_string(), "--step-by", "20"])
        .args(["--rate-per-s", "2000", "--burst", "8", "--count", &frames.to_string(), "--warmup-s", "0"])
        .args(["--duration-s", "30"])
        .output()
        .expect("run xdp-gen");
    let json = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "xdp-gen failed: {}", String::from_utf8_lossy(&out.stderr));
    let got = reader.join().expect("reader thread");
    assert_eq!(field(&json, "sent_total"), frames, "{json}");
    assert_eq!(field(&json, "frames_built"), frames, "{json}");
    assert_eq!(field(&json, "records"), frames * 4, "{json}");
    assert_eq!(field(&json, "templates"), 18, "{json}");
    assert_eq!(field(&json, "step_frame"), step, "{json}");
    let stamp = field(&json, "step_sent_mono_ns");
    assert!(field(&json, "step_sent_unix_ns") > 1_600_000_000_000_000_000, "{json}");
    assert_eq!(got.len() as u64, frames, "every frame reached the socket");
    for (i, (values, _)) in got.iter().enumerate() {
        assert_eq!(values.len(), 4, "datagram {i}: {values:?}");
        // Noise of stddev 1 around 10, then around 30: the sets are 20 apart.
        let stepped = values.iter().all(|v| *v > 20.0);
        let plain = values.iter().all(|v| *v < 20.0);
        assert!(if (i as u64) < step { plain } else { stepped }, "datagram {i} ({values:?}), step at {step}");
    }
    // Round-robin within each set: datagram i and i + 9 are the same template.
    assert_eq!(got[0].0, got[9].0);
    assert_eq!(got[step as usize].0, got[step as usize + 9].0);
    assert_ne!(got[0].0, got[1].0);
    let first_stepped_at = got[step as usize].1;
    assert!(stamp <= first_stepped_at, "stamp {stamp} after the first shifted datagram arrived ({first_stepped_at})");
    assert!(stamp >= got[0].1, "stamp {stamp} before the first datagram arrived ({})", got[0].1);
    drop(pass);
    drop(net);
}
