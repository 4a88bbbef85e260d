//! Placement scorers: how good one node (and device) is for a pod.
//!
//! [`Policy::find_placement`](crate::policy::Policy::find_placement) enumerates the feasible
//! options (every node that passes the filters; for a shared GPU request, every device with
//! room, one per distinct free amount) and asks a [`Scorer`] to score each; the best node wins, ties broken by a [`TieBreak`]. Scorers are
//! small pure functions of the node before and after the placement:
//!
//! | scorer | what it prefers |
//! | --- | --- |
//! | [`BestFit`] | least CPU and GPU left on the node (the FGD paper's `05-BestFit`) |
//! | [`GpuPacking`] | shared GPUs, then GPUs of used nodes, then idle nodes (`04-GpuPacking`) |
//! | [`Fgd`] | the smallest growth of the node's fragmentation, as the FGD paper scores it (`06-FGD`) |
//! | [`FragmentationAware`] | ours: FGD's score; its ties to the least growth of the capacity the mix cannot fill in whole copies (CPU and devices), then to best fit; in a mix heavy in multi-GPU tasks, both measured per copy of each class (and single-device requests keep FGD's ties) |
//! | [`Random`] | a seeded pseudo-random node (`01-Random`) |

use std::cell::OnceCell;

use crate::devices::NodeView;
use crate::fragmentation::FragIndex;
use crate::ids::NodeId;
use crate::quantity::MILLI_PER_DEVICE;

/// One option a scorer scores: a pod on a node (and device), with the node before and after.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    pub node: NodeId,
    pub before: NodeView<'a>,
    pub after: NodeView<'a>,
    pub request_cpu_milli: u64,
    /// Total GPU request, milli.
    pub request_gpu_milli: u64,
    /// Devices of the (first) GPU request; 0 for a CPU-only pod.
    pub request_devices: u32,
    /// Milli per device of the (first) GPU request.
    pub request_milli_per_device: u32,
    /// The device shared, for a shared (fractional) request: an index into
    /// [`NodeView::gpu_free`].
    pub shared_device: Option<usize>,
    pub(crate) frag: Option<&'a FragIndex>,
    pub(crate) frag_before: f64,
    /// The node's unfillable capacity before, computed by the first scorer that asks: it is
    /// the same for every option on the node.
    pub(crate) unfillable_before: &'a OnceCell<f64>,
    /// The mix per copy, and its `F_n` and unfillable capacity of the node before (computed
    /// once per node, when asked), for [`Candidate::per_copy`].
    pub(crate) per_copy: Option<&'a FragIndex>,
    pub(crate) per_copy_before: &'a OnceCell<f64>,
    pub(crate) per_copy_unfillable_before: &'a OnceCell<f64>,
}

impl Candidate<'_> {
    /// The same option measured against the mix per copy
    /// ([`WorkloadMix::per_copy`](crate::fragmentation::WorkloadMix::per_copy)): every
    /// fragmentation method of the result reads that mix.
    #[must_use]
    pub fn per_copy(&self) -> Self {
        let Some(index) = self.per_copy else {
            return *self;
        };
        let before = &self.before;
        let frag_before = *self.per_copy_before.get_or_init(|| {
            index.node_fragmentation(before.model, before.cpu_free, before.layout, before.free)
        });
        Self {
            frag: Some(index),
            frag_before,
            unfillable_before: self.per_copy_unfillable_before,
            per_copy: None,
            ..*self
        }
    }

    /// Whether a workload mix is known (otherwise fragmentation is 0 everywhere).
    pub fn has_workload_mix(&self) -> bool {
        self.frag.is_some()
    }

    /// `F_n` of the node before the placement, milli.
    pub fn fragmentation_before(&self) -> f64 {
        self.frag_before
    }

    /// `F_n` of the node after the placement, milli (computed on each call).
    pub fn fragmentation_after(&self) -> f64 {
        self.frag.map_or(0.0, |index| {
            index.node_fragmentation(
                self.after.model,
                self.after.cpu_free,
                self.after.layout,
                self.after.free,
            )
        })
    }

    /// The node's idle GPU the mix cannot fill, before the placement, milli: `F_n` with each
    /// class credited only with the whole copies of it the free devices and CPU hold
    /// (computed once per node).
    pub fn unfillable_before(&self) -> f64 {
        *self
            .unfillable_before
            .get_or_init(|| self.unfillable(&self.before))
    }

    /// The share of the workload mix's expected GPU request made by multi-GPU classes
    /// ([`WorkloadMix::multi_device_share`](crate::fragmentation::WorkloadMix::multi_device_share));
    /// 0 without a mix.
    pub fn multi_device_share(&self) -> f64 {
        self.frag.map_or(0.0, FragIndex::multi_device_share)
    }

    /// [`Candidate::unfillable_before`] after the placement (computed on each call).
    pub fn unfillable_after(&self) -> f64 {
        self.unfillable(&self.after)
    }

    fn unfillable(&self, view: &NodeView<'_>) -> f64 {
        self.frag.map_or(0.0, |index| {
            index.node_unfillable(view.model, view.cpu_free, view.layout, view.free)
        })
    }
}

/// A scorer's verdict on one option; higher is better in every field.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Score {
    /// Compared across nodes.
    pub node: f64,
    /// Breaks ties between nodes of equal `node`, before the [`TieBreak`].
    pub tie: f64,
    /// Chooses among a node's options of equal `node` and `tie` (the device to share); the
    /// first (lowest-numbered) option wins remaining ties.
    pub device: f64,
}

/// Scores placement options. Implementations must be pure: same candidate, same score.
pub trait Scorer: Send + Sync {
    fn score(&self, candidate: &Candidate<'_>) -> Score;
}

/// How ties between equally scored nodes are broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TieBreak {
    /// The first node in the snapshot's order (by name): deterministic, as the operator needs.
    First,
    /// A pseudo-random node, the same for the same seed: kube-scheduler picks uniformly among
    /// the best nodes, which the FGD paper's simulator inherits.
    Seeded(u64),
}

impl TieBreak {
    pub(crate) fn key(self, node: NodeId) -> u64 {
        match self {
            Self::First => node.0.into(),
            Self::Seeded(seed) => {
                mix64(seed ^ u64::from(node.0).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            }
        }
    }
}

/// SplitMix64's finaliser: a well-spread hash of a 64-bit value.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The FGD paper's scores are integers in 0..=100 (`framework.MaxNodeScore`).
const MAX_NODE_SCORE: f64 = 100.0;
/// The paper's normalisers for best-fit: 128 cores and 8 GPUs.
const MAX_SPEC_CPU_MILLI: f64 = 128_000.0;
const MAX_SPEC_GPU_MILLI: f64 = 8_000.0;

/// The FGD paper's best-fit: `(1 − Σ_i w_i · free_i,after / maxSpec_i) × 100` over CPU and GPU
/// with equal weights, as an integer; a shared request takes the fullest device that fits.
#[derive(Clone, Copy, Debug, Default)]
pub struct BestFit;

impl BestFit {
    /// The unrounded score in [0, 1] (higher: less left over).
    fn fit(candidate: &Candidate<'_>) -> f64 {
        let after = &candidate.after;
        #[allow(clippy::cast_precision_loss)]
        let cpu = if after.reports_cpu() {
            after.cpu_free as f64 / MAX_SPEC_CPU_MILLI
        } else {
            0.0
        };
        #[allow(clippy::cast_precision_loss)]
        let gpu = after.idle_milli() as f64 / MAX_SPEC_GPU_MILLI;
        1.0 - (0.5 * cpu + 0.5 * gpu)
    }
}

/// The fuller the shared device, the better (best fit within the node).
fn fullest_device(candidate: &Candidate<'_>) -> f64 {
    candidate
        .shared_device
        .map_or(0.0, |d| -f64::from(candidate.before.free[d]))
}

impl Scorer for BestFit {
    fn score(&self, candidate: &Candidate<'_>) -> Score {
        Score {
            node: (Self::fit(candidate) * MAX_NODE_SCORE).trunc(),
            tie: 0.0,
            device: fullest_device(candidate),
        }
    }
}

/// The FGD paper's GPU packing: a shared GPU first (the fuller the better), then free GPUs of a
/// node already in use (the fewer the better), then an idle node (the fewer GPUs the better).
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuPacking;

impl Scorer for GpuPacking {
    fn score(&self, candidate: &Candidate<'_>) -> Score {
        let device = fullest_device(candidate);
        if candidate.request_gpu_milli == 0 {
            return Score {
                node: 0.0,
                tie: 0.0,
                device,
            };
        }
        let before = &candidate.before;
        let total = before.free.len();
        let fully_free = before.fully_free_devices();
        #[allow(clippy::cast_precision_loss)]
        let node = if fully_free == total {
            let score = (MAX_NODE_SCORE / 3.0).trunc() - fully_free as f64;
            score.max(fully_free as f64)
        } else {
            // The devices it would use: those it changes.
            let (mut whole_used, mut shared_free_pct) = (0u32, 0u64);
            for (b, a) in before.free.iter().zip(candidate.after.free) {
                if a < b {
                    if u32::from(*b) == MILLI_PER_DEVICE {
                        whole_used += 1;
                    } else {
                        shared_free_pct += u64::from(*b) * 100 / u64::from(MILLI_PER_DEVICE);
                    }
                }
            }
            if whole_used > 0 {
                ((MAX_NODE_SCORE / 2.0).trunc() - f64::from(whole_used))
                    .max((MAX_NODE_SCORE / 3.0).trunc())
            } else {
                (MAX_NODE_SCORE - (shared_free_pct / 10) as f64).max((MAX_NODE_SCORE / 2.0).trunc())
            }
        };
        Score {
            node,
            tie: 0.0,
            device,
        }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// FGD as the paper scores it: `⌊sigmoid((F_before − F_after) / 1000) × 100⌋`; for a shared
/// request, the device with the best score (the first on ties).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fgd;

impl Scorer for Fgd {
    fn score(&self, candidate: &Candidate<'_>) -> Score {
        let delta = candidate.fragmentation_before() - candidate.fragmentation_after();
        let node = (sigmoid(delta / 1000.0) * MAX_NODE_SCORE).trunc();
        Score {
            node,
            tie: 0.0,
            device: 0.0,
        }
    }
}

/// Ours: FGD's score, with the ties FGD leaves to the order of node names sent to the option
/// that strands the least capacity, then to the best fit; in a mix where multi-GPU tasks weigh,
/// all of it measured per copy of each task class.
///
/// In DESIGN §6 terms: the scorer places a pod where it increases FGD's fragmentation measure
/// least, exactly as FGD scores it (`⌊sigmoid(ΔF_n / 1000) × 100⌋`, see [`Fgd`]). Those 100
/// levels are coarse and many options tie, where FGD's simulator takes the first node by name.
/// Ours breaks the ties by a truer measure of the same thing,
/// [`Candidate::unfillable_before`]: `F_n` with each class credited only with the whole copies
/// of it the node's free devices and CPU hold, so leftovers inside a device, an odd GPU a
/// multi-GPU class cannot pair and GPUs whose CPU is gone count as waste. The option whose
/// waste grows least wins (whole milli), then the least idle GPU left (best fit), then the
/// [`TieBreak`]; within a node, the device FGD prefers, then the one that strands least.
/// Keeping FGD's score first keeps its information: rounding down to whole copies alone hides
/// changes FGD's `F_n` still sees.
///
/// **Per copy, where multi-GPU tasks weigh** (their classes make at least
/// [`MULTI_DEVICE_MIX`] of the mix's expected request, [`Candidate::multi_device_share`]):
/// everything above is measured against the mix per copy
/// ([`WorkloadMix::per_copy`](crate::fragmentation::WorkloadMix::per_copy)), so losing room for
/// one 8-GPU task weighs as much as losing room for one 2-GPU task, each by how often it
/// arrives, instead of FGD keeping whole nodes open for the large tasks while the GPUs it
/// strands for the many small ones go unused. In such a mix a one-device request keeps FGD's
/// ties as FGD leaves them: packing small requests by the copies they strand pays too little
/// attention to how many nodes stay whole.
///
/// Each rule was measured against FGD on the same arrivals, and the tie keys tried and not
/// kept are listed, in `crates/sim/results/placement/fgd-reproduction.md`; the cost (`make
/// bench-core`) stays far below 1 ms a decision at 1,000 nodes. Without a workload mix it is
/// best fit.
#[derive(Clone, Copy, Debug, Default)]
pub struct FragmentationAware;

/// The share of the mix's expected GPU request made by multi-GPU classes from which
/// [`FragmentationAware`] leaves single-device requests' ties to the node order.
pub const MULTI_DEVICE_MIX: f64 = 0.1;

/// Packs two tie keys into [`Score::tie`]: the fall of the whole-copy waste, in whole milli,
/// above the idle GPU left on the node, which stays below this many milli (1,000 GPUs).
const TIE_STRIDE: f64 = 1_000_000.0;

impl Scorer for FragmentationAware {
    fn score(&self, candidate: &Candidate<'_>) -> Score {
        if !candidate.has_workload_mix() {
            return Score {
                node: BestFit::fit(candidate),
                tie: 0.0,
                device: fullest_device(candidate),
            };
        }
        if candidate.multi_device_share() >= MULTI_DEVICE_MIX {
            return Self::rank(&candidate.per_copy());
        }
        Self::rank(candidate)
    }
}

impl FragmentationAware {
    /// FGD's score, and its ties by the whole-copy key (as the candidate's mix measures both).
    fn rank(candidate: &Candidate<'_>) -> Score {
        let fgd = Fgd.score(candidate);
        if candidate.request_devices == 1 && candidate.multi_device_share() >= MULTI_DEVICE_MIX {
            return fgd;
        }
        let stranded_less = (candidate.unfillable_before() - candidate.unfillable_after()).round();
        #[allow(clippy::cast_precision_loss)]
        let idle_after = candidate.after.idle_milli() as f64;
        Score {
            node: fgd.node,
            tie: stranded_less * TIE_STRIDE - idle_after,
            device: 0.0,
        }
    }
}

/// A pseudo-random choice among the feasible nodes (and devices), the same for the same seed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Random {
    pub seed: u64,
}

impl Scorer for Random {
    fn score(&self, candidate: &Candidate<'_>) -> Score {
        #[allow(clippy::cast_precision_loss)]
        let draw = |x: u64| (mix64(self.seed ^ x) >> 11) as f64;
        let device = candidate.shared_device.map_or(0.0, |d| {
            draw(0xD1CE ^ (d as u64) << 32 ^ u64::from(candidate.node.0))
        });
        Score {
            node: draw(u64::from(candidate.node.0)),
            tie: 0.0,
            device,
        }
    }
}
