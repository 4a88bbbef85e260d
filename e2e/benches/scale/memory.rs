//! The operator's resident memory over the run, from `/proc/<pid>/status` (`VmRSS`, and
//! `VmHWM`, the kernel's own peak, so a spike between two samples is not missed).

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, AtomicU32, Ordering},
};
use std::time::{Duration, Instant};

/// How often memory is sampled.
const EVERY: Duration = Duration::from_millis(250);

/// One sample.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    pub seconds: f64,
    pub phase: &'static str,
    pub rss_mib: f64,
    pub hwm_mib: f64,
}

/// Samples the process whose pid is set (0: none) until dropped, labelling each sample with
/// the current phase.
pub struct Sampler {
    pid: Arc<AtomicU32>,
    phase: Arc<Mutex<&'static str>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    pub fn start() -> Self {
        let sampler = Self {
            pid: Arc::default(),
            phase: Arc::new(Mutex::new("start")),
            samples: Arc::default(),
            stop: Arc::default(),
        };
        let (pid, phase, taken, stop) = (
            sampler.pid.clone(),
            sampler.phase.clone(),
            sampler.samples.clone(),
            sampler.stop.clone(),
        );
        std::thread::spawn(move || {
            #[allow(clippy::disallowed_methods)] // the benchmark's own clock
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let current = pid.load(Ordering::Relaxed);
                if let Some((rss_mib, hwm_mib)) = (current != 0).then(|| read(current)).flatten() {
                    taken.lock().unwrap().push(Sample {
                        seconds: start.elapsed().as_secs_f64(),
                        phase: *phase.lock().unwrap(),
                        rss_mib,
                        hwm_mib,
                    });
                }
                std::thread::sleep(EVERY);
            }
        });
        sampler
    }

    /// Follows `pid` from now on (0: nothing to sample).
    pub fn follow(&self, pid: u32) {
        self.pid.store(pid, Ordering::Relaxed);
    }

    pub fn phase(&self, phase: &'static str) {
        *self.phase.lock().unwrap() = phase;
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn read(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|line| line.starts_with(name))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The median and the largest `VmRSS` of `phase`'s samples, and the largest `VmHWM`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Summary {
    pub median_rss_mib: f64,
    pub max_rss_mib: f64,
    pub peak_hwm_mib: f64,
    pub samples: usize,
}

pub fn summary(samples: &[Sample], phase: Option<&str>) -> Option<Summary> {
    let chosen: Vec<&Sample> = samples
        .iter()
        .filter(|s| phase.is_none_or(|p| s.phase == p))
        .collect();
    let mut rss: Vec<f64> = chosen.iter().map(|s| s.rss_mib).collect();
    rss.sort_by(f64::total_cmp);
    Some(Summary {
        median_rss_mib: *rss.get(rss.len() / 2)?,
        max_rss_mib: *rss.last()?,
        peak_hwm_mib: chosen.iter().map(|s| s.hwm_mib).fold(0.0, f64::max),
        samples: chosen.len(),
    })
}
