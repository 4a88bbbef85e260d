//! Measurement runner for issue 18: the final allocation of variants of ours' tie keys on the
//! openb traces, seed by seed, against FGD (ties by the run's node order) on the same arrivals.
//!
//! `cargo run --release -p gpuqueue-sim --example tiekeys -- TRACES SEEDS VARIANTS`
//! (comma lists; SEEDS like `42-71`; variants: `fgd`, `ours`, `ours-seeded` and the
//! experimental keys of [`Exp`], among them `ours2`, ours as it ranked before it measured
//! multi-GPU-heavy mixes per copy; a variant `V@A` runs `V` against the mix with each GPU
//! class's share multiplied by its request in GPUs to the power `A` (one of −1, −0.75, −0.5,
//! −0.25, 0.25, 0.5, 1; `@mA`: multi-GPU classes only), see [`reweighted`]). It runs the study's loop (`fgd_submission_order`, 130% load,
//! `Policy::find_placement`, failed tasks dropped) without the per-arrival curves, so a run
//! takes about 2 s. Results are cached in /tmp/tiekeys-cache.tsv keyed by (trace, seed,
//! variant); delete it after changing a variant. `DIAG=1` prints idle GPUs by node type and
//! failed tasks by shape at the end of each run. A scratch tool: not part of `make bench-sim`.
#![allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::cast_precision_loss,
    clippy::too_many_lines,
    clippy::many_single_char_names,
    missing_debug_implementations
)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpuqueue_core::fragmentation::{TaskShape, WorkloadMix};
use gpuqueue_core::placement::{
    Candidate, Fgd, FragmentationAware, Score, Scorer, TieBreak, mix64,
};
use gpuqueue_core::{Policy, Snapshot};
use gpuqueue_sim::convert;
use gpuqueue_sim::engine::SimTime;
use gpuqueue_sim::sampling::fgd_submission_order;
use gpuqueue_sim::trace::{load_nodes, load_pods};

/// An experimental variant of ours, by name (see `score`).
struct Exp(&'static str);

fn name_hash(c: &Candidate<'_>, salt: u64) -> f64 {
    let mut h = salt;
    for b in c.before.node().name.bytes() {
        h = mix64(h ^ u64::from(b));
    }
    -((h >> 11) as f64)
}

impl Scorer for Exp {
    fn score(&self, c: &Candidate<'_>) -> Score {
        let fgd = Fgd.score(c);
        let multi = c.multi_device_share() >= 0.1;
        let single = c.request_devices == 1;
        let stranded_less = (c.unfillable_before() - c.unfillable_after()).round();
        let idle_after = c.after.idle_milli() as f64;
        let ours_tie = stranded_less * 1e6 - idle_after;
        let total = c.before.gpu_free().len() as f64;
        let ff_before = c.before.fully_free_devices() as f64;
        let node_idle = c.before.fully_free_devices() == c.before.gpu_free().len();
        let t = match self.0 {
            // ours before it measured multi-GPU-heavy mixes per copy (counted, as FGD counts)
            "ours2" => {
                if single && multi {
                    0.0
                } else {
                    ours_tie
                }
            }
            // single-device ties in multi mixes: smallest node first
            "sd-small" => {
                if single && multi {
                    -total
                } else {
                    ours_tie
                }
            }
            // single-device ties: avoid opening an idle node
            "sd-noopen" => {
                if single && multi {
                    if node_idle && total > 0.0 { -1.0 } else { 0.0 }
                } else {
                    ours_tie
                }
            }
            // single-device ties: the node with fewest fully free devices
            "sd-fewff" => {
                if single && multi {
                    -ff_before
                } else {
                    ours_tie
                }
            }
            // single-device ties: most fully free devices (spread)
            "sd-mostff" => {
                if single && multi {
                    ff_before
                } else {
                    ours_tie
                }
            }
            "sd-hash" => {
                if single && multi {
                    name_hash(c, 7)
                } else {
                    ours_tie
                }
            }
            // smallest node first, for every request in multi mixes, then ours' keys
            "all-small" => {
                if multi {
                    -total * 1e12 + if single { 0.0 } else { ours_tie }
                } else {
                    ours_tie
                }
            }
            // single-device: whole-copy key only (no best fit)
            "sd-wc" => {
                if single && multi {
                    stranded_less
                } else {
                    ours_tie
                }
            }
            // single-device: best fit only
            "sd-bf" => {
                if single && multi {
                    -idle_after
                } else {
                    ours_tie
                }
            }
            // single-device: CPU balance: least CPU per idle GPU left beyond the node's share
            "sd-cpubal" => {
                if single && multi {
                    let cap = c.before.node().cpu_milli as f64;
                    let gpus = total.max(1.0);
                    let cpu_after = c.after.cpu_free_milli() as f64;
                    // keep cpu_after / cap close to idle_after / capacity
                    -((cpu_after / cap) - (idle_after / (gpus * 1000.0))).abs()
                } else {
                    ours_tie
                }
            }
            // everything: ours' keys (no single-device exception)
            "nosd" => ours_tie,
            // exact ΔF as node score in multi mixes (then first name)
            "exact-multi" => {
                if multi {
                    return Score {
                        node: c.fragmentation_before() - c.fragmentation_after(),
                        tie: 0.0,
                        device: 0.0,
                    };
                }
                ours_tie
            }
            // single-device in multi mixes: FGD's node ties, but the fullest device of a node
            "sd-devbf" | "all-devbf" => {
                let dev = c
                    .shared_device
                    .map_or(0.0, |d| -f64::from(c.before.gpu_free()[d]));
                let applies = multi && (single || self.0 == "all-devbf");
                return Score {
                    node: fgd.node,
                    tie: if single && multi { 0.0 } else { ours_tie },
                    device: if applies { dev } else { 0.0 },
                };
            }
            other => panic!("unknown variant {other}"),
        };
        Score {
            node: fgd.node,
            tie: t,
            device: 0.0,
        }
    }
}

/// The mix with each class's share multiplied by its GPU request (in GPUs) to the power `a`,
/// renormalised: classes weighed by the GPUs they ask for rather than by their count.
fn reweighted(mix: &WorkloadMix, a: f64, multi_only: bool) -> WorkloadMix {
    let classes: Vec<(TaskShape, f64)> = mix
        .classes()
        .iter()
        .map(|(shape, p)| {
            let gpus = shape
                .gpu
                .as_ref()
                .map_or(0.0, |g| g.total().0 as f64 / 1000.0);
            (
                shape.clone(),
                if gpus == 0.0 || (multi_only && gpus <= 1.0) {
                    *p
                } else {
                    p * gpus.powf(a)
                },
            )
        })
        .filter(|(_, w)| *w > 0.0)
        .collect();
    let sum: f64 = classes.iter().map(|(_, w)| w).sum();
    WorkloadMix::new(classes.into_iter().map(|(s, w)| (s, w / sum)).collect())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let traces: Vec<&str> = args[1].split(',').collect();
    let seeds: Vec<u64> = match args[2].split_once('-') {
        Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect(),
        None => args[2].split(',').map(|s| s.parse().unwrap()).collect(),
    };
    let variants: Vec<&'static str> = args[3]
        .split(',')
        .map(|s| &*Box::leak(s.to_string().into_boxed_str()))
        .collect();
    let threads: usize = std::env::var("THREADS").map_or(2, |t| t.parse().unwrap());
    let data = PathBuf::from(
        std::env::var("GPUQUEUE_DATA_DIR").unwrap_or_else(|_| "/work/shared/data".into()),
    )
    .join("alibaba-gpu-v2023");
    let nodes = load_nodes(&data.join("openb_node_list_gpu_node.csv")).unwrap();
    let capacity: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
    let cache_path = "/tmp/tiekeys-cache.tsv";
    let mut cache: HashMap<(String, u64, String), f64> = HashMap::new();
    if let Ok(text) = std::fs::read_to_string(cache_path) {
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            cache.insert(
                (f[0].into(), f[1].parse().unwrap(), f[2].into()),
                f[3].parse().unwrap(),
            );
        }
    }
    let mut loaded = Vec::new();
    for t in &traces {
        let tasks = load_pods(&data.join(format!("openb_pod_list_{t}.csv"))).unwrap();
        let mix = convert::workload_mix(&tasks);
        let build = |mix: WorkloadMix| {
            Snapshot::builder()
                .nodes(nodes.iter().map(convert::node))
                .workload_mix(mix)
                .build()
                .0
        };
        let mut weighted = HashMap::new();
        for a in [-1.0_f64, -0.75, -0.5, -0.25, 0.25, 0.5, 1.0] {
            weighted.insert(format!("{a}"), build(reweighted(&mix, a, false)));
            weighted.insert(format!("m{a}"), build(reweighted(&mix, a, true)));
        }
        let empty = build(mix);
        loaded.push((t.to_string(), tasks, empty, weighted));
    }
    let mut jobs = Vec::new();
    for (ti, (t, _, _, _)) in loaded.iter().enumerate() {
        for &s in &seeds {
            for v in &variants {
                if !cache.contains_key(&(t.clone(), s, v.to_string())) {
                    jobs.push((ti, s, *v));
                }
            }
        }
    }
    eprintln!("{} jobs", jobs.len());
    let next = AtomicUsize::new(0);
    let out = Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(cache_path)
            .unwrap(),
    );
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(trace_index, seed, v)) = jobs.get(i) else { break };
                let (t, tasks, empty, weighted) = &loaded[trace_index];
                let order = fgd_submission_order(tasks, capacity * 1000, 1.3, seed).unwrap();
                let name = v;
                let (v, snap_of) = match v.split_once('@') {
                    Some((base, a)) => (&*Box::leak(base.to_string().into_boxed_str()), &weighted[a]),
                    None => (v, empty),
                };
                let mut snap = snap_of.clone();
                let exp = Exp(v);
                let policy = match v {
                    "fgd" => Policy::new(&Fgd, TieBreak::Seeded(seed)),
                    "ours" => Policy::new(&FragmentationAware, TieBreak::First),
                    "ours-seeded" => Policy::new(&FragmentationAware, TieBreak::Seeded(seed)),
                    _ => Policy::new(&exp, TieBreak::First),
                };
                let mut used: HashMap<String, (u64, u64, u64)> = HashMap::new();
                let mut failed: HashMap<(u32, u32), u64> = HashMap::new();
                for (index, &task_index) in order.iter().enumerate() {
                    let task = &tasks[task_index];
                    let pod = convert::pod("trace", format!("{}-{index}", task.name), task, SimTime::ZERO);
                    if let Some(p) = policy.find_placement(&snap, &pod) {
                        let e = used.entry(p.node_name.clone()).or_default();
                        e.0 += task.total_gpu_milli();
                        e.1 += u64::from(task.cpu_milli);
                        e.2 += 1;
                        let _ = snap.add_placed(pod, &p);
                    } else {
                        *failed.entry((task.num_gpu, task.gpu_milli)).or_default() += 1;
                    }
                }
                if std::env::var("DIAG").is_ok() {
                    // by node type: nodes, idle GPUs, idle on nodes with < 4 cores free, fully idle nodes
                    let mut by: std::collections::BTreeMap<String, (u64, f64, f64, u64)> =
                        std::collections::BTreeMap::default();
                    for n in &nodes {
                        let (g, c, _) = used.get(&n.name).copied().unwrap_or_default();
                        let key = format!("{}x{} {}c", n.gpus, n.gpu_model.as_deref().unwrap_or("-"), n.cpu_milli / 1000);
                        let e = by.entry(key).or_default();
                        let idle = (u64::from(n.gpus) * 1000 - g) as f64 / 1000.0;
                        e.0 += 1;
                        e.1 += idle;
                        if u64::from(n.cpu_milli) - c < 4000 { e.2 += idle; }
                        if g == 0 && n.gpus > 0 { e.3 += 1; }
                    }
                    let mut text = format!("DIAG {t} {seed} {v}\n");
                    for (k, (n, idle, starved, whole)) in by {
                        let _ = writeln!(text, "  {k:>22}: nodes {n:4} idle {idle:7.2} cpu-starved idle {starved:7.2} untouched {whole}");
                    }
                    let mut f: Vec<_> = failed.into_iter().collect();
                    f.sort_unstable();
                    let _ = writeln!(text, "  failed by (gpus, milli): {f:?}");
                    eprint!("{text}");
                }
                let alloc = snap.fragmentation().allocation() * 100.0;
                eprintln!("{t} {seed} {name}: {alloc:.3}");
                writeln!(out.lock().unwrap(), "{t}\t{seed}\t{name}\t{alloc}").unwrap();
                results.lock().unwrap().push(((t.clone(), seed, name.to_string()), alloc));
            });
        }
    });
    for (k, a) in results.into_inner().unwrap() {
        cache.insert(k, a);
    }
    for (t, _, _, _) in &loaded {
        println!("\n== {t} (final allocation %, Δ = variant − fgd per seed)");
        for v in &variants {
            let mut deltas = Vec::new();
            let mut vals = Vec::new();
            for &s in &seeds {
                let a = cache[&(t.clone(), s, v.to_string())];
                let f = cache.get(&(t.clone(), s, "fgd".to_string())).copied();
                vals.push(a);
                if let Some(f) = f {
                    deltas.push(a - f);
                }
            }
            let n = vals.len() as f64;
            let mean = vals.iter().sum::<f64>() / n;
            let dm = deltas.iter().sum::<f64>() / deltas.len().max(1) as f64;
            let sd = (deltas.iter().map(|d| (d - dm).powi(2)).sum::<f64>()
                / (deltas.len().max(2) - 1) as f64)
                .sqrt();
            let ge = deltas.iter().filter(|d| **d >= -1e-9).count();
            let per: Vec<String> = deltas.iter().map(|d| format!("{d:+.2}")).collect();
            println!(
                "{v:>12}: mean {mean:.3}  Δ {dm:+.3} ± {sd:.3}  ≥ on {ge}/{}  [{}]",
                deltas.len(),
                per.join(" ")
            );
        }
    }
}
