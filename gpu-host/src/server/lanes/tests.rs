//! Lane bookkeeping with real threads and sockets, serving no service (the
//! serve tests run requests through a lane).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;
use crate::affinity::{CpuMap, cpus_of_thread};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bh-lanes-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn all_cpus() -> Vec<usize> {
    CpuMap::of_this_process().unwrap().all()
}

fn wanted(lanes: &[(&str, &[usize])]) -> BTreeMap<String, Vec<usize>> {
    lanes
        .iter()
        .map(|(tenant, cpus)| (tenant.to_string(), cpus.to_vec()))
        .collect()
}

/// The lane thread of `tenant`: its kernel id and name.
fn thread_of(lanes: &LaneListeners, tenant: &str) -> (Pid, String) {
    let state = lanes.state.lock().unwrap();
    let tid = state.lanes[tenant].tid;
    let comm =
        std::fs::read_to_string(format!("/proc/self/task/{}/comm", tid.as_raw_nonzero())).unwrap();
    (tid, comm.trim().to_string())
}

fn accepts(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

#[test]
fn a_lane_is_pinned_re_pinned_and_unadvertised_as_its_tenant_changes() {
    let dir = temp_dir("repin");
    let main = dir.join("host.sock");
    let all = all_cpus();
    let (first, last) = (all[0], all[all.len() - 1]);
    let lanes = LaneListeners::new(Target::Unix(main.clone()), all.clone());

    lanes.apply(&wanted(&[("acme", &[first])]), Routes::default);
    let socket = dir.join("host.sock.lane0");
    assert_eq!(
        lanes.advertised(),
        BTreeMap::from([("acme".to_string(), format!("unix:{}", socket.display()))])
    );
    let (tid, name) = thread_of(&lanes, "acme");
    assert_eq!(name, "lane:acme");
    assert_eq!(cpus_of_thread(tid), [first]);
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(accepts(&socket));

    // New CPUs: the same thread moves; no second lane.
    lanes.apply(&wanted(&[("acme", &[last])]), Routes::default);
    assert_eq!(thread_of(&lanes, "acme").0, tid);
    assert_eq!(cpus_of_thread(tid), [last]);
    assert_eq!(lanes.advertised().len(), 1);

    // No longer dedicated: not advertised, on every CPU, still serving.
    lanes.apply(&BTreeMap::new(), Routes::default);
    assert!(lanes.advertised().is_empty());
    assert_eq!(cpus_of_thread(tid), all);
    assert!(accepts(&socket));

    // Dedicated again: the same lane, advertised and pinned again.
    lanes.apply(&wanted(&[("acme", &[first])]), Routes::default);
    assert_eq!(thread_of(&lanes, "acme").0, tid);
    assert_eq!(cpus_of_thread(tid), [first]);
    assert_eq!(lanes.advertised().len(), 1);

    lanes.join();
    assert!(
        !socket.exists(),
        "the lane's socket is removed when it stops"
    );
    assert!(lanes.advertised().is_empty());
    // Stopped: no lane starts any more.
    lanes.apply(&wanted(&[("acme", &[first])]), Routes::default);
    assert!(lanes.advertised().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_socket_path_too_long_for_linux_fails_only_that_lane_and_says_why() {
    let dir = temp_dir("long");
    let main = dir.join("h".repeat(100));
    let all = all_cpus();
    let lanes = LaneListeners::new(Target::Unix(main.clone()), all.clone());
    lanes.apply(&wanted(&[("acme", &all)]), Routes::default);
    assert!(lanes.advertised().is_empty());

    let error = lanes
        .start("acme", &all, 7, Routes::default())
        .unwrap_err()
        .to_string();
    let lane_path = format!("{}.lane7", main.display());
    assert!(error.contains(&lane_path), "{error}");
    assert!(error.contains("too long"), "{error}");
    assert!(error.contains("107"), "{error}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing left");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tcp_lane_listens_on_the_main_ip_on_a_port_of_its_own() {
    let all = all_cpus();
    let main: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let lanes = LaneListeners::new(Target::Tcp(main), all.clone());
    lanes.apply(&wanted(&[("acme", &all)]), Routes::default);
    let target: Target = lanes.advertised()["acme"].parse().unwrap();
    let Target::Tcp(addr) = target else {
        panic!("{target}")
    };
    assert_eq!(addr.ip(), main.ip());
    assert_ne!(addr.port(), 0);
    assert!(std::net::TcpStream::connect(addr).is_ok());
    lanes.join();
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "closed at stop"
    );
}
