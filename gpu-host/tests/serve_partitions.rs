//! `serve` with partitions: `SetPartitions` turns the tenant set into one
//! scheduler per partition, pinned to its cores; jobs run in their tenant's
//! partition; a new layout takes new requests while streams in flight
//! finish on the old one; a set that does not fit is refused and the old
//! layout keeps serving.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use bulkhead_protocol::v1::generate_event::Event;
use bulkhead_protocol::v1::generate_request::Prompt;
mod common;

use bulkhead_protocol::v1::gpu_host_client::GpuHostClient;
use bulkhead_protocol::{Target, connect, v1};
use common::{Host, model, start_unix};
use tonic::Code;
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;

/// A host with the llama fixture on a 2-core CPU device with 4 MiB of KV
/// memory (2 KiB a token for this model: 2,048 tokens).
fn start(name: &str) -> Host {
    start_with(name, &[])
}

/// [`start`] with more `serve` arguments.
fn start_with(name: &str, extra: &[&str]) -> Host {
    let llama = format!("llama={}", model("llama-q8_0.gguf"));
    let args: Vec<&str> = ["--model", &llama, "--threads", "2", "--kv-memory", "4MiB"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    start_unix(name, &args)
}

fn dedicated(tenant: &str, cus: u32, hbm: u64) -> v1::TenantGpu {
    v1::TenantGpu {
        tenant: tenant.into(),
        cus: Some(cus),
        hbm_bytes: Some(hbm),
        isolation: v1::Isolation::Dedicated.into(),
        ..Default::default()
    }
}

fn request(tenant: &str, max_tokens: u32) -> v1::GenerateRequest {
    v1::GenerateRequest {
        model: "llama".into(),
        prompt: Some(Prompt::Text("Once upon a time".into())),
        max_tokens: Some(max_tokens),
        tenant: tenant.into(),
        ..Default::default()
    }
}

/// Completion tokens of a stream read to its end.
async fn finish(mut stream: tonic::Streaming<v1::GenerateEvent>) -> u32 {
    let mut tokens = 0;
    while let Some(event) = stream.message().await.unwrap() {
        match event.event {
            Some(Event::Delta(d)) => tokens += d.token_ids.len() as u32,
            Some(Event::Finished(f)) => {
                assert_eq!(f.usage.unwrap().completion_tokens, tokens);
                return tokens;
            }
            _ => {}
        }
    }
    panic!("the stream ended without Finished");
}

async fn set(
    client: &mut GpuHostClient<Channel>,
    tenants: Vec<v1::TenantGpu>,
) -> Result<v1::SetPartitionsResponse, tonic::Status> {
    client
        .set_partitions(v1::SetPartitionsRequest { tenants })
        .await
        .map(|r| r.into_inner())
}

async fn report(client: &mut GpuHostClient<Channel>) -> v1::PartitionsResponse {
    client
        .partitions(v1::PartitionsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Waits (bounded) until `done` holds of the host's report.
async fn until(
    client: &mut GpuHostClient<Channel>,
    what: &str,
    done: impl Fn(&v1::PartitionsResponse) -> bool,
) -> v1::PartitionsResponse {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = report(client).await;
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "never {what}: {r:#?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn no_draining(r: &v1::PartitionsResponse) -> bool {
    r.partitions.iter().all(|p| !p.draining)
}

/// `0-2,5` → [0, 1, 2, 5].
fn cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

fn allowed_cpus(status: &str) -> Vec<usize> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("status has Cpus_allowed_list");
    cpu_list(line)
}

/// Each of `pid`'s threads: its name and the CPUs it may run on.
fn threads_of(pid: u32) -> Vec<(String, Vec<usize>)> {
    let mut threads = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return threads;
    };
    for task in tasks.flatten() {
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(task.path().join("comm")),
            std::fs::read_to_string(task.path().join("status")),
        ) else {
            continue; // the thread exited meanwhile
        };
        threads.push((comm.trim().to_string(), allowed_cpus(&status)));
    }
    threads.sort();
    threads
}

#[tokio::test]
async fn dedicated_tenants_run_on_their_own_pinned_cores() {
    let ours = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    if ours.len() < 2 {
        bulkhead_testkit::skip(
            bulkhead_testkit::Need::Cpus(2),
            format!("this process may run on CPUs {ours:?}; pinning two partitions needs 2"),
        );
        return;
    }
    let mut host = start("pinned");
    let mut client = host.client().await;
    let answer = set(
        &mut client,
        vec![dedicated("a", 1, MIB), dedicated("b", 1, MIB)],
    )
    .await
    .unwrap();
    assert!(answer.changed);
    let layout = until(&mut client, "replaced the first layout", no_draining).await;
    let cores: Vec<(&str, &[u32], u64)> = layout
        .partitions
        .iter()
        .map(|p| (p.id.as_str(), p.cores.as_slice(), p.memory_bytes))
        .collect();
    assert_eq!(
        cores,
        [
            ("dedicated:a", &[0][..], MIB),
            ("dedicated:b", &[1][..], MIB)
        ]
    );
    for tenant in ["a", "b"] {
        let stream = client.generate(request(tenant, 4)).await.unwrap();
        assert_eq!(finish(stream.into_inner()).await, 4);
    }
    // The unit → CPU map is the host's allowed CPUs in order (it inherited ours).
    let (cpu_a, cpu_b) = (ours[0], ours[1]);
    let pid = host.child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let threads = loop {
        let threads = threads_of(pid);
        let kernels = threads
            .iter()
            .filter(|(name, _)| name.starts_with("bulkhead-kern"))
            .count();
        // The first layout's team (the whole host: its caller and one
        // worker) exits once replaced. A one-core partition's team is its
        // own thread alone, with no workers to start.
        if kernels == 0 {
            break threads;
        }
        assert!(Instant::now() < deadline, "workers: {threads:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let by_name: BTreeMap<&str, &Vec<usize>> =
        threads.iter().map(|(n, c)| (n.as_str(), c)).collect();
    // The partition threads run the kernels themselves; workers they would
    // start inherit their mask (`affinity`'s unit test).
    assert_eq!(by_name.get("part:a"), Some(&&vec![cpu_a]), "{threads:?}");
    assert_eq!(by_name.get("part:b"), Some(&&vec![cpu_b]), "{threads:?}");
}

fn shared(tenant: &str) -> v1::TenantGpu {
    v1::TenantGpu {
        tenant: tenant.into(),
        isolation: v1::Isolation::Shared.into(),
        ..Default::default()
    }
}

/// Runs `request` to its end: its completion tokens, or the host's refusal.
async fn generate(
    mut client: GpuHostClient<Channel>,
    request: v1::GenerateRequest,
) -> Result<u32, tonic::Status> {
    let stream = client.generate(request).await?;
    Ok(finish(stream.into_inner()).await)
}

/// A queue per partition, and in the shared pool a guaranteed part per
/// tenant: `acme` floods the shared pool without pause, keeping its queue
/// full, yet every request of `demo` (dedicated) and of `beta` (shared,
/// within its guaranteed part) is served. With one queue for the host,
/// `acme` holds every place and both are refused.
#[tokio::test]
async fn a_flood_in_the_shared_pool_refuses_no_dedicated_or_guaranteed_request() {
    // 4 places a partition, and a step of one row (each batch holds two).
    let mut host = start_with("flood", &["--queue-capacity", "4", "--max-batch", "1"]);
    let mut client = host.client().await;
    let tenants = vec![dedicated("demo", 1, MIB), shared("acme"), shared("beta")];
    set(&mut client, tenants).await.unwrap();
    until(&mut client, "replaced the first layout", no_draining).await;
    // Eight of acme's clients, each sending again as soon as it is
    // answered, refused or not.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood: Vec<_> = (0..8)
        .map(|_| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let mut refused = 0u32;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Err(e) = generate(client.clone(), request("acme", 300)).await {
                        assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
                        refused += 1;
                        tokio::task::yield_now().await;
                    }
                }
                refused
            })
        })
        .collect();
    let full = until(&mut client, "acme filled the shared queue", |r| {
        r.partitions.iter().any(|p| {
            p.id == "shared"
                && p.tenants
                    .iter()
                    .any(|t| t.tenant == "acme" && t.queued == 4 && t.queue_refusals > 0)
        })
    })
    .await;
    let shared_pool = full.partitions.iter().find(|p| p.id == "shared").unwrap();
    let guaranteed: BTreeMap<&str, u32> = shared_pool
        .tenants
        .iter()
        .map(|t| (t.tenant.as_str(), t.queue_guaranteed))
        .collect();
    assert_eq!(guaranteed, BTreeMap::from([("acme", 2), ("beta", 2)]));
    // demo's 4 places and beta's 2, all at once, into a queue acme keeps full.
    let victims: Vec<_> = std::iter::repeat_n("demo", 4)
        .chain(std::iter::repeat_n("beta", 2))
        .map(|tenant| {
            let client = client.clone();
            tokio::spawn(async move { (tenant, generate(client, request(tenant, 8)).await) })
        })
        .collect();
    for victim in victims {
        let (tenant, result) = victim.await.unwrap();
        assert_eq!(result.map_err(|e| format!("{tenant}: {e}")), Ok(8));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut refused = 0;
    for f in flood {
        refused += f.await.unwrap();
    }
    assert!(refused > 0, "acme's flood never met its limit");
}

/// Two shared tenants with weights 3 and 1, both flooding the pool with
/// the same number of requests in flight, get 0.75 and 0.25 of the decode
/// tokens (within 0.05). A FIFO queue, or one row per sequence, gives each
/// half: the requests go in alternately and neither tenant has more.
#[tokio::test]
async fn weights_three_to_one_give_three_quarters_of_the_decode_tokens() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

    // Steps of four decode rows; the batch keeps eight sequences in KV,
    // so every request in flight runs and each tenant always has more
    // sequences than its share of a step's rows.
    let mut host = start_with("weights", &["--max-batch", "4"]);
    let mut client = host.client().await;
    let weighted = |tenant: &str, weight| v1::TenantGpu {
        weight,
        ..shared(tenant)
    };
    set(
        &mut client,
        vec![weighted("heavy", 3), weighted("light", 1)],
    )
    .await
    .unwrap();
    until(&mut client, "replaced the first layout", no_draining).await;
    let stop = Arc::new(AtomicBool::new(false));
    let tokens: Arc<[AtomicU64; 2]> = Arc::default();
    let mut floods = Vec::new();
    // Each tenant's four streams have different lengths, so they do not
    // all end (and wait for their client to ask again) at the same step;
    // the lengths are the same for both tenants.
    for length in [96, 128, 160, 192] {
        for (i, tenant) in ["heavy", "light"].into_iter().enumerate() {
            let (mut client, stop, tokens) = (client.clone(), stop.clone(), tokens.clone());
            floods.push(tokio::spawn(async move {
                while !stop.load(SeqCst) {
                    let mut stream = client
                        .generate(v1::GenerateRequest {
                            temperature: Some(0.0),
                            ..request(tenant, length)
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    while let Some(event) = stream.message().await.unwrap() {
                        if let Some(Event::Delta(d)) = event.event {
                            tokens[i].fetch_add(d.token_ids.len() as u64, SeqCst);
                        }
                    }
                }
            }));
        }
    }
    let read = || [tokens[0].load(SeqCst), tokens[1].load(SeqCst)];
    // Measured from when both decode, over the next 600 tokens.
    let deadline = Instant::now() + Duration::from_secs(120);
    let wait_for = |done: &dyn Fn([u64; 2]) -> bool| {
        let tokens = read();
        assert!(Instant::now() < deadline, "stuck at {tokens:?} tokens");
        done(tokens)
    };
    while !wait_for(&|t| t[0] > 0 && t[1] > 0) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let start = read();
    while !wait_for(&|t| t[0] + t[1] >= start[0] + start[1] + 600) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let end = read();
    stop.store(true, SeqCst);
    for flood in floods {
        flood.await.unwrap();
    }
    let (heavy, light) = (end[0] - start[0], end[1] - start[1]);
    let share = heavy as f64 / (heavy + light) as f64;
    assert!(
        (share - 0.75).abs() <= 0.05,
        "heavy got {heavy} and light {light} decode tokens: {share:.3} of them"
    );
}

/// Tokens of the stream kept in flight across a layout change.
const LONG_STREAM: u32 = 480;

#[tokio::test]
async fn a_new_layout_takes_new_requests_while_a_stream_in_flight_finishes() {
    // The old stream must still run when the new layout is in place. Its
    // 480 tokens take ~0.3 s, but starting the new layout's schedulers can
    // wait as long for a busy core (one is pinned to the core the stream
    // runs on), so on a loaded machine the stream may end first; that
    // attempt proves nothing and is run again on a fresh host.
    for attempt in 0..5 {
        if swap_with_a_stream_in_flight(&format!("swap{attempt}")).await {
            return;
        }
        eprintln!("attempt {attempt}: the stream ended before the swap; again");
    }
    panic!("the stream never stayed in flight across the swap in 5 attempts");
}

/// One attempt; false when the stream had ended before the swap.
async fn swap_with_a_stream_in_flight(name: &str) -> bool {
    let mut host = start(name);
    let mut client = host.client().await;
    let before = report(&mut client).await;
    assert_eq!(before.generation, 1);
    assert_eq!(
        (before.device.as_str(), before.unit.as_str()),
        ("cpu", "cores")
    );
    assert_eq!((before.compute_units, before.memory_bytes), (2, 4 * MIB));

    // A long stream for `a` starts in the shared pool: as long as the
    // fixture's 512-token context allows, so that it is still running when
    // the layout changes (120 tokens could finish first on a quiet machine).
    let mut old = client
        .generate(request("a", LONG_STREAM))
        .await
        .unwrap()
        .into_inner();
    let first = old.message().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(Event::Started(_))));
    // The scheduler publishes its load after each step, and `Started` can
    // reach us within the step that admitted the stream: wait for the
    // report to count it before swapping the layout under it.
    until(&mut client, "the stream counted in the shared pool", |r| {
        r.partitions
            .iter()
            .any(|p| p.id == "shared" && p.running == 1)
    })
    .await;

    let answer = set(&mut client, vec![dedicated("a", 1, MIB)])
        .await
        .unwrap();
    assert!(answer.changed);
    let layout = answer.layout.unwrap();
    assert_eq!(layout.generation, 2);
    let draining: Vec<_> = layout.partitions.iter().filter(|p| p.draining).collect();
    if draining.iter().all(|p| p.running == 0) {
        assert_eq!(finish(old).await, LONG_STREAM);
        return false;
    }
    assert_eq!(draining.len(), 1, "{layout:#?}");
    assert_eq!(
        (draining[0].id.as_str(), draining[0].running),
        ("shared", 1),
        "{layout:#?}"
    );

    // A new request for `a` runs in its dedicated partition, its blocks
    // charged to it there.
    let mut new = client
        .generate(request("a", LONG_STREAM))
        .await
        .unwrap()
        .into_inner();
    new.message().await.unwrap().unwrap(); // Started: it holds KV now
    let now = report(&mut client).await;
    let mine = now
        .partitions
        .iter()
        .find(|p| p.id == "dedicated:a" && !p.draining)
        .unwrap();
    assert_eq!((mine.cores.as_slice(), mine.running), (&[0][..], 1));
    assert_eq!(mine.tenants.len(), 1);
    assert_eq!(mine.tenants[0].tenant, "a");
    assert_eq!(mine.tenants[0].budget_bytes, MIB);

    // Both finish; the old scheduler then exits.
    assert_eq!(finish(old).await, LONG_STREAM);
    assert_eq!(finish(new).await, LONG_STREAM);
    let after = until(&mut client, "drained the old layout", no_draining).await;
    assert_eq!(after.partitions.len(), 2, "{after:#?}"); // dedicated:a + shared
    // A stream's last event reaches the client before its scheduler drops
    // the finished sequence from its counts at the end of that step.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = client
            .health(v1::HealthRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(health.workers, 2);
        if (health.running, health.queued) == (0, 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still busy after both streams: {health:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The same set again changes nothing.
    let again = set(&mut client, vec![dedicated("a", 1, MIB)])
        .await
        .unwrap();
    assert!(!again.changed);
    assert_eq!(again.layout.unwrap().generation, 2);
    true
}

#[tokio::test]
async fn an_oversubscribed_set_is_refused_and_the_old_layout_keeps_serving() {
    let mut host = start("refused");
    let mut client = host.client().await;
    set(&mut client, vec![dedicated("a", 1, MIB)])
        .await
        .unwrap();
    let before = until(&mut client, "replaced the first layout", no_draining).await;

    let refused = set(
        &mut client,
        vec![dedicated("a", 2, MIB), dedicated("b", 1, 8 * MIB)],
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    for needle in [
        "dedicated cores: a 2 + b 1 = 3 > 2 on cpu",
        "b 8MiB",
        "4MiB",
    ] {
        assert!(refused.message().contains(needle), "{}", refused.message());
    }
    let bad_wire = set(
        &mut client,
        vec![v1::TenantGpu {
            tenant: "a".into(),
            cus: Some(1),
            share: Some(0.5),
            ..Default::default()
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(bad_wire.code(), Code::InvalidArgument);
    assert!(bad_wire.message().contains("set cus or share, not both"));

    let after = report(&mut client).await;
    assert_eq!(after, before);
    let stream = client.generate(request("a", 5)).await.unwrap();
    assert_eq!(finish(stream.into_inner()).await, 5);
    // A tenant the plan does not list runs in the shared pool.
    let stream = client.generate(request("stranger", 5)).await.unwrap();
    assert_eq!(finish(stream.into_inner()).await, 5);
}

/// A client of a lane's target, as `Partitions` reports it.
async fn lane_client(target: &str) -> GpuHostClient<Channel> {
    let target: Target = target.parse().expect("a lane target parses");
    GpuHostClient::new(connect(&target).await.expect("the lane accepts"))
}

/// The CPUs of `pid`'s thread named `name`.
fn thread_cpus(pid: u32, name: &str) -> Vec<usize> {
    let threads = threads_of(pid);
    let found = threads.iter().find(|(n, _)| n == name);
    found.map(|(_, cpus)| cpus.clone()).unwrap_or_else(|| {
        panic!("no thread `{name}`: {threads:?}");
    })
}

#[tokio::test]
async fn a_dedicated_tenant_is_served_on_its_own_lane_pinned_to_its_cpus() {
    let ours = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    let mut host = start("lane");
    let mut client = host.client().await;
    set(&mut client, vec![dedicated("a", 1, MIB)])
        .await
        .unwrap();
    let layout = until(&mut client, "replaced the first layout", no_draining).await;
    let mine = layout
        .partitions
        .iter()
        .find(|p| p.id == "dedicated:a")
        .unwrap();
    let Target::Unix(main) = &host.target else {
        unreachable!()
    };
    assert_eq!(mine.lane, format!("unix:{}.lane0", main.display()));
    let host_cpus: Vec<usize> = mine.host_cpus.iter().map(|&c| c as usize).collect();
    assert_eq!(host_cpus, [ours[0]]);
    let shared = layout.partitions.iter().find(|p| p.id == "shared").unwrap();
    assert_eq!(shared.host_cpus, [ours[1 % ours.len()] as u32]);
    assert_eq!(shared.lane, "", "only a dedicated partition has a lane");

    let mut lane = lane_client(&mine.lane).await;
    let stream = lane.generate(request("a", 4)).await.unwrap();
    assert_eq!(finish(stream.into_inner()).await, 4);
    let pid = host.child.id();
    assert_eq!(thread_cpus(pid, "lane:a"), host_cpus);

    // Shared again: the lane is no longer reported and moves to every CPU,
    // but the connection it holds still serves.
    let answer = set(&mut client, vec![]).await.unwrap();
    assert!(answer.changed);
    let layout = answer.layout.unwrap();
    assert!(
        layout.partitions.iter().all(|p| p.lane.is_empty()),
        "{layout:#?}"
    );
    assert_eq!(thread_cpus(pid, "lane:a"), ours);
    let stream = lane.generate(request("a", 4)).await.unwrap();
    assert_eq!(finish(stream.into_inner()).await, 4);
}

#[tokio::test]
async fn shutdown_finishes_a_stream_open_on_a_lane() {
    let mut host = start("lanedrain");
    let mut client = host.client().await;
    let answer = set(&mut client, vec![dedicated("a", 1, MIB)])
        .await
        .unwrap();
    let layout = answer.layout.unwrap();
    let target = layout
        .partitions
        .iter()
        .find(|p| p.id == "dedicated:a" && !p.draining)
        .map(|p| p.lane.clone())
        .unwrap();
    let mut lane = lane_client(&target).await;
    let mut stream = lane
        .generate(request("a", LONG_STREAM))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(Event::Started(_))));
    let status = Command::new("kill")
        .args(["-TERM", &host.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(finish(stream).await, LONG_STREAM);
    let exit = host.child.wait().unwrap();
    assert!(exit.success(), "{exit}");
    let Some(Target::Unix(socket)) = target.parse().ok() else {
        panic!("{target}")
    };
    assert!(!socket.exists(), "the lane's socket is removed at exit");
}
