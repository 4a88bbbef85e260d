//! GPU fragmentation as the FGD paper (Weng et al., USENIX ATC '23) measures it.
//!
//! The target workload is a mix of task shapes with their shares. For a node `n` and a task
//! class `m`, the fragment is the node's idle GPU capacity that `m` cannot use:
//! - all of it when `m` requests no GPU, when `m`'s GPU models exclude the node's, or when the
//!   node lacks enough devices with `m`'s per-device request free, or enough free CPU;
//! - otherwise the free capacity of the devices whose free part is below `m`'s per-device
//!   request (the leftovers `m` cannot use), plus any devices of other resources.
//!
//! `F_n = Σ_m p_m · frag_n(m)` and the cluster's fragmentation is `Σ_n F_n`. Written as
//! `F_n = idle_n − Σ_m p_m · usable_n(m)`, classes can be grouped by (resource, per-device
//! request, device count) with their CPU thresholds sorted, so one node is measured in a few
//! passes over its devices, which keeps FGD scoring fast enough for whole-trace simulations.

use std::collections::HashMap;

use crate::devices::PoolLayout;
use crate::ids::{ModelId, ResourceId};
use crate::model::{GpuRequest, Pod};
use crate::quantity::ResourceName;

/// The share of all tasks the typical shapes must cover (the FGD simulator's
/// `podPopularityThreshold: 95`).
pub const DEFAULT_POPULARITY: f64 = 0.95;

/// One task shape of the workload mix: CPU, at most one GPU request, allowed GPU models.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskShape {
    pub cpu_milli: u64,
    /// `None`: a CPU-only task.
    pub gpu: Option<GpuRequest>,
    /// Allowed GPU models as the task lists them; empty: any. Not normalised, because FGD
    /// groups tasks by the model list as written (`A|B|B` is a class of its own), and the
    /// published values depend on that.
    pub gpu_models: Vec<String>,
}

impl TaskShape {
    /// The shape of a pod: its CPU, its first GPU request and its GPU models. A pod that
    /// requests several GPU resources (rare) is classed by the first, as FGD classes by one.
    pub fn of_pod(pod: &Pod) -> Self {
        ShapeOf::of(pod).to_owned()
    }
}

/// A pod's [`TaskShape`] borrowed from it, equal when the owned shapes are.
#[derive(PartialEq, Eq, Hash)]
struct ShapeOf<'a> {
    cpu_milli: u64,
    gpu: Option<&'a GpuRequest>,
    gpu_models: &'a [String],
}

impl<'a> ShapeOf<'a> {
    fn of(pod: &'a Pod) -> Self {
        Self {
            cpu_milli: pod.requests.cpu_milli,
            gpu: pod.requests.gpus.first(),
            gpu_models: &pod.gpu_models,
        }
    }

    fn to_owned(&self) -> TaskShape {
        TaskShape {
            cpu_milli: self.cpu_milli,
            gpu: self.gpu.cloned(),
            gpu_models: self.gpu_models.to_vec(),
        }
    }
}

/// Tasks per shape.
type Counts<K> = HashMap<K, u64, foldhash::fast::RandomState>;

/// Pods counted by [`TaskShape`], kept as pods come and go: the mix of 10,000 pods is not
/// counted again for each one that changes.
#[derive(Clone, Debug, Default)]
pub struct ShapeCounts {
    counts: Counts<TaskShape>,
}

impl ShapeCounts {
    /// The pods' shapes, counted without copying them.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut counts: Counts<ShapeOf<'a>> = HashMap::default();
        for pod in pods {
            *counts.entry(ShapeOf::of(pod)).or_default() += 1;
        }
        Self {
            counts: counts
                .into_iter()
                .map(|(shape, n)| (shape.to_owned(), n))
                .collect(),
        }
    }

    pub fn add(&mut self, pod: &Pod) {
        *self.counts.entry(TaskShape::of_pod(pod)).or_default() += 1;
    }

    /// Uncounts a pod counted before.
    pub fn remove(&mut self, pod: &Pod) {
        let shape = TaskShape::of_pod(pod);
        if let Some(n) = self.counts.get_mut(&shape) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&shape);
            }
        }
    }

    /// [`WorkloadMix::from_shapes`] of the pods counted.
    pub fn mix(&self, popularity: f64) -> WorkloadMix {
        let groups = self
            .counts
            .iter()
            .map(|(shape, n)| (shape.clone(), *n))
            .collect();
        WorkloadMix::from_counts(groups, popularity)
    }
}

/// The workload mix fragmentation is measured against: task classes with shares summing to 1.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadMix {
    classes: Vec<(TaskShape, f64)>,
}

impl WorkloadMix {
    /// The "typical pods" of FGD: group the shapes, sort the groups by count (descending;
    /// equal counts by shape, descending, as the FGD simulator orders them), keep groups until
    /// their cumulative share reaches `popularity` (0.95 in the paper), then renormalise the
    /// kept shares to sum to 1.
    pub fn from_shapes<I: IntoIterator<Item = TaskShape>>(shapes: I, popularity: f64) -> Self {
        let mut counts: Counts<TaskShape> = HashMap::default();
        for shape in shapes {
            *counts.entry(shape).or_default() += 1;
        }
        Self::from_counts(counts.into_iter().collect(), popularity)
    }

    /// [`Self::from_shapes`] of the pods' shapes ([`TaskShape::of_pod`]), counted without
    /// copying them: the operator measures every pod in every pass.
    pub fn from_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>, popularity: f64) -> Self {
        ShapeCounts::of(pods).mix(popularity)
    }

    fn from_counts(mut groups: Vec<(TaskShape, u64)>, popularity: f64) -> Self {
        let total: u64 = groups.iter().map(|(_, n)| n).sum();
        if total == 0 {
            return Self::default();
        }
        // Equal counts and FGD orders by the shape itself: a stable order whatever the hasher.
        groups.sort_by(|(a, n), (b, m)| {
            m.cmp(n)
                .then_with(|| fgd_shape_order(b).cmp(&fgd_shape_order(a)))
                .then_with(|| b.cmp(a))
        });
        #[allow(clippy::cast_precision_loss)] // task counts are far below 2^52
        let wanted = popularity * total as f64;
        let mut kept = Vec::new();
        let mut covered = 0u64;
        for (shape, count) in groups {
            #[allow(clippy::cast_precision_loss)]
            if covered as f64 >= wanted {
                break;
            }
            covered += count;
            kept.push((shape, count));
        }
        #[allow(clippy::cast_precision_loss)]
        let classes = kept
            .into_iter()
            .map(|(shape, n)| (shape, n as f64 / covered as f64))
            .collect();
        Self { classes }
    }

    /// A mix with the given shares (normalised to sum to 1; non-positive shares are dropped).
    pub fn new(classes: Vec<(TaskShape, f64)>) -> Self {
        let classes: Vec<_> = classes
            .into_iter()
            .filter(|(_, p)| *p > 0.0 && p.is_finite())
            .collect();
        let total: f64 = classes.iter().map(|(_, p)| p).sum();
        Self {
            classes: classes.into_iter().map(|(s, p)| (s, p / total)).collect(),
        }
    }

    /// The classes and their shares, most frequent first.
    pub fn classes(&self) -> &[(TaskShape, f64)] {
        &self.classes
    }

    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// The mix with each GPU class's share divided by its request in GPUs (`count × milli /
    /// 1000`), CPU-only classes as they are, renormalised. `F_n` against it measures the
    /// stranded capacity in copies of each class rather than in GPUs: a GPU an 8-GPU class
    /// cannot use counts an eighth as much as one a 1-GPU class cannot use, and a device a
    /// half-GPU class cannot use twice as much (see
    /// [`FragmentationAware`](crate::placement::FragmentationAware) for where ours uses it).
    #[must_use]
    pub fn per_copy(&self) -> Self {
        Self::new(
            self.classes
                .iter()
                .map(|(shape, p)| {
                    let gpus = shape.gpu.as_ref().map_or(0.0, |g| {
                        f64::from(g.count) * f64::from(g.milli_per_device)
                            / f64::from(crate::quantity::MILLI_PER_DEVICE)
                    });
                    let share = if gpus > 0.0 { p / gpus } else { *p };
                    (shape.clone(), share)
                })
                .collect(),
        )
    }

    /// The share of the mix's expected GPU request (`Σ p_m · devices_m · milli_m` over the
    /// classes that request a GPU) that classes of two or more devices make: 0 when no
    /// typical class is multi-GPU, 1 when all are.
    pub fn multi_device_share(&self) -> f64 {
        let (mut multi, mut all) = (0.0, 0.0);
        for (shape, p) in &self.classes {
            let Some(gpu) = &shape.gpu else { continue };
            let demand = p * f64::from(gpu.count) * f64::from(gpu.milli_per_device);
            all += demand;
            if gpu.count >= 2 {
                multi += demand;
            }
        }
        if all > 0.0 { multi / all } else { 0.0 }
    }
}

/// The order of FGD's `PodResource.Less`: CPU, milli-GPU per device, device count, GPU type.
fn fgd_shape_order(shape: &TaskShape) -> (u64, u32, u32, String) {
    let (milli, count) = shape
        .gpu
        .as_ref()
        .map_or((0, 0), |g| (g.milli_per_device, g.count));
    (shape.cpu_milli, milli, count, shape.gpu_models.join("|"))
}

/// Cluster-wide fragmentation.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterFragmentation {
    /// GPU capacity of all nodes, milli.
    pub capacity_milli: u64,
    /// Free GPU capacity, milli.
    pub idle_milli: u64,
    /// `Σ_n F_n`, milli (expected free capacity the workload mix cannot use).
    pub fragmented_milli: f64,
}

impl ClusterFragmentation {
    /// Fragmentation as a share of all GPU capacity (FGD's "fragmentation amount", Fig. 7b).
    pub fn share_of_capacity(&self) -> f64 {
        ratio(self.fragmented_milli, self.capacity_milli)
    }

    /// Fragmentation as a share of idle GPU capacity (FGD's "fragmentation ratio", Fig. 7a).
    pub fn share_of_idle(&self) -> f64 {
        ratio(self.fragmented_milli, self.idle_milli)
    }

    /// Allocated GPU capacity as a share of all capacity (FGD's "GPU allocation ratio").
    pub fn allocation(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        ratio(
            (self.capacity_milli - self.idle_milli) as f64,
            self.capacity_milli,
        )
    }
}

fn ratio(part: f64, whole: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    if whole == 0 { 0.0 } else { part / whole as f64 }
}

/// Classes with the same (resource, per-device request, device count) accessible on one GPU
/// model, with CPU thresholds sorted so `P(cpu fits)` is one binary search.
#[derive(Clone, Debug)]
struct ClassGroup {
    resource: ResourceId,
    milli: u16,
    count: u16,
    /// CPU requests, ascending.
    cpu: Vec<u64>,
    /// `share_up_to[k]`: summed share of the first `k` entries of `cpu` (`share_up_to[0] = 0`).
    share_up_to: Vec<f64>,
}

/// The mix compiled against a snapshot's resource and model ids.
#[derive(Clone, Debug, Default)]
pub(crate) struct FragIndex {
    /// Index 0: nodes without a GPU model; index `m + 1`: model id `m`.
    by_model: Vec<Vec<ClassGroup>>,
    /// [`WorkloadMix::multi_device_share`] of the mix.
    multi_device_share: f64,
}

impl FragIndex {
    /// Compiles `mix` for `models` (by id) and a resource lookup.
    pub(crate) fn new(
        mix: &WorkloadMix,
        models: &[String],
        resource_id: impl Fn(&ResourceName) -> Option<ResourceId>,
    ) -> Self {
        let mut by_model = Vec::with_capacity(models.len() + 1);
        for slot in 0..=models.len() {
            let model = slot.checked_sub(1).map(|m| models[m].as_str());
            let mut groups: Vec<ClassGroup> = Vec::new();
            let mut members: Vec<Vec<(u64, f64)>> = Vec::new();
            for (shape, share) in &mix.classes {
                let Some(gpu) = &shape.gpu else { continue };
                let accessible = shape.gpu_models.is_empty()
                    || model.is_some_and(|m| shape.gpu_models.iter().any(|allowed| allowed == m));
                let Some(resource) = resource_id(&gpu.resource) else {
                    continue;
                };
                let (Ok(milli), Ok(count)) = (
                    u16::try_from(gpu.milli_per_device),
                    u16::try_from(gpu.count),
                ) else {
                    continue;
                };
                if !accessible || count == 0 || milli == 0 {
                    continue;
                }
                let existing = groups
                    .iter()
                    .position(|g| g.resource == resource && g.milli == milli && g.count == count);
                let at = existing.unwrap_or_else(|| {
                    groups.push(ClassGroup {
                        resource,
                        milli,
                        count,
                        cpu: Vec::new(),
                        share_up_to: Vec::new(),
                    });
                    members.push(Vec::new());
                    groups.len() - 1
                });
                members[at].push((shape.cpu_milli, *share));
            }
            for (group, mut entries) in groups.iter_mut().zip(members) {
                entries.sort_by_key(|e| e.0);
                group.cpu = entries.iter().map(|(cpu, _)| *cpu).collect();
                group.share_up_to = std::iter::once(0.0)
                    .chain(entries.iter().scan(0.0, |sum, (_, p)| {
                        *sum += p;
                        Some(*sum)
                    }))
                    .collect();
            }
            by_model.push(groups);
        }
        Self {
            by_model,
            multi_device_share: mix.multi_device_share(),
        }
    }

    /// [`WorkloadMix::multi_device_share`] of the compiled mix.
    pub(crate) fn multi_device_share(&self) -> f64 {
        self.multi_device_share
    }

    /// `F_n` of a node: its model, free CPU, and the free milli of each device (`free`, laid
    /// out in pools by `layout`).
    pub(crate) fn node_fragmentation(
        &self,
        model: Option<ModelId>,
        cpu_free: i64,
        layout: &[PoolLayout],
        free: &[u16],
    ) -> f64 {
        let idle: u64 = free.iter().map(|f| u64::from(*f)).sum();
        if idle == 0 {
            return 0.0;
        }
        let groups = model.map_or(self.by_model.first(), |m| {
            self.by_model.get(usize::from(m.0) + 1)
        });
        let mut usable = 0.0;
        for group in groups.into_iter().flatten() {
            let Some(pool) = layout.iter().find(|p| p.resource == group.resource) else {
                continue;
            };
            let (mut fitting, mut fitting_milli) = (0u16, 0u64);
            for &f in &free[usize::from(pool.start)..usize::from(pool.start + pool.len)] {
                if f >= group.milli {
                    fitting += 1;
                    fitting_milli += u64::from(f);
                }
            }
            if fitting < group.count {
                continue;
            }
            let cpu_fits = group
                .cpu
                .partition_point(|&c| i128::from(c) <= i128::from(cpu_free));
            #[allow(clippy::cast_precision_loss)]
            {
                usable += group.share_up_to[cpu_fits] * fitting_milli as f64;
            }
        }
        #[allow(clippy::cast_precision_loss)]
        (idle as f64 - usable).max(0.0)
    }

    /// The node's idle GPU capacity the mix cannot fill, milli: [`Self::node_fragmentation`]
    /// with each fitting class credited only with what copies of it would take, as many whole
    /// requests as the free devices and the free CPU hold. A device with 1000 free holds two
    /// 470s (60 stay idle), and a node with 8 free GPUs but CPU for two 11-core tasks holds two
    /// GPUs of them; `F_n` counts all of both as usable.
    pub(crate) fn node_unfillable(
        &self,
        model: Option<ModelId>,
        cpu_free: i64,
        layout: &[PoolLayout],
        free: &[u16],
    ) -> f64 {
        let idle: u64 = free.iter().map(|f| u64::from(*f)).sum();
        if idle == 0 {
            return 0.0;
        }
        let groups = model.map_or(self.by_model.first(), |m| {
            self.by_model.get(usize::from(m.0) + 1)
        });
        let cpu = u64::try_from(cpu_free).unwrap_or(0);
        let mut usable = 0.0;
        for group in groups.into_iter().flatten() {
            let Some(pool) = layout.iter().find(|p| p.resource == group.resource) else {
                continue;
            };
            let (mut fitting, mut slots) = (0u64, 0u64);
            for &f in &free[usize::from(pool.start)..usize::from(pool.start + pool.len)] {
                if f >= group.milli {
                    fitting += 1;
                    // Most requests are over half a device: one copy, no division.
                    slots += if f < 2 * group.milli {
                        1
                    } else {
                        u64::from(f / group.milli)
                    };
                }
            }
            // A multi-device request takes whole devices: one copy per `count` fitting devices.
            let copies_by_gpu = if group.count == 1 {
                slots
            } else {
                fitting / u64::from(group.count)
            };
            if copies_by_gpu == 0 {
                continue;
            }
            #[allow(clippy::cast_precision_loss)]
            let milli_per_copy = (u64::from(group.count) * u64::from(group.milli)) as f64;
            // Classes come by CPU, ascending: the first ones have CPU for as many copies as
            // the devices take, the next ones for fewer, the last ones for none.
            let fitting_classes = group
                .cpu
                .partition_point(|&c| i128::from(c) <= i128::from(cpu_free));
            let fed = cpu / copies_by_gpu;
            let fully_fed = group.cpu[..fitting_classes].partition_point(|&c| c <= fed);
            #[allow(clippy::cast_precision_loss)]
            {
                usable += group.share_up_to[fully_fed] * (copies_by_gpu as f64) * milli_per_copy;
                for k in fully_fed..fitting_classes {
                    let share = group.share_up_to[k + 1] - group.share_up_to[k];
                    usable += share * ((cpu / group.cpu[k]) as f64) * milli_per_copy;
                }
            }
        }
        #[allow(clippy::cast_precision_loss)]
        (idle as f64 - usable).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(cpu: u64, gpu: Option<GpuRequest>) -> TaskShape {
        TaskShape {
            cpu_milli: cpu,
            gpu,
            gpu_models: Vec::new(),
        }
    }

    #[test]
    fn typical_shapes_cover_the_popularity_threshold_and_renormalise() {
        let a = shape(1000, Some(GpuRequest::devices("nvidia.com/gpu", 1)));
        let b = shape(2000, Some(GpuRequest::shared("nvidia.com/gpu", 500)));
        let c = shape(4000, None);
        let shapes = std::iter::repeat_n(a.clone(), 70)
            .chain(std::iter::repeat_n(b.clone(), 26))
            .chain(std::iter::repeat_n(c, 4));
        let mix = WorkloadMix::from_shapes(shapes, DEFAULT_POPULARITY);
        assert_eq!(mix.classes().len(), 2, "96% is covered by two shapes");
        assert_eq!(mix.classes()[0].0, a);
        assert!((mix.classes()[0].1 - 70.0 / 96.0).abs() < 1e-12);
        assert!((mix.classes()[1].1 - 26.0 / 96.0).abs() < 1e-12);
    }

    #[test]
    fn pods_are_grouped_by_their_shapes_as_written() {
        use crate::model::{PodKey, Requests};
        use jiff::Timestamp;
        let pod = |i: usize, gpu: GpuRequest, models: &[&str]| {
            let mut pod = Pod::new(
                PodKey::new("ns", format!("p{i}")),
                Requests {
                    cpu_milli: 1000,
                    memory_bytes: 0,
                    gpus: vec![gpu],
                    quota_only: Vec::new(),
                },
                Timestamp::UNIX_EPOCH,
            );
            pod.gpu_models = models.iter().map(ToString::to_string).collect();
            pod
        };
        let whole = GpuRequest::devices("nvidia.com/gpu", 1);
        let mig = GpuRequest::devices("nvidia.com/mig-1g.10gb", 1);
        // Four shapes of two pods each: the two of equal FGD order (the resource is all that
        // differs) in the shapes' own order, whichever the hasher gives first; `A|B` and
        // `A|B|B` stay two classes.
        let pods: Vec<Pod> = (0..8)
            .map(|i| match i % 4 {
                0 => pod(i, whole.clone(), &[]),
                1 => pod(i, mig.clone(), &[]),
                2 => pod(i, whole.clone(), &["A", "B"]),
                _ => pod(i, whole.clone(), &["A", "B", "B"]),
            })
            .collect();
        let from_pods = WorkloadMix::from_pods(&pods, 1.0);
        assert_eq!(
            from_pods,
            WorkloadMix::from_shapes(pods.iter().map(TaskShape::of_pod), 1.0)
        );
        let classes: Vec<(&TaskShape, f64)> =
            from_pods.classes().iter().map(|(s, p)| (s, *p)).collect();
        assert_eq!(classes.len(), 4);
        assert!(classes.iter().all(|(_, p)| (p - 0.25).abs() < 1e-12));
        assert_eq!(classes[0].0.gpu_models, ["A", "B", "B"]);
        assert_eq!(classes[1].0.gpu_models, ["A", "B"]);
        assert_eq!(
            classes[2].0.gpu.as_ref().unwrap().resource.as_str(),
            "nvidia.com/mig-1g.10gb"
        );
        assert_eq!(classes[3].0.gpu.as_ref().unwrap(), &whole);
    }

    #[test]
    fn multi_device_share_weighs_classes_by_their_gpu_request() {
        // Half-GPU tasks (share 1/2, 250 milli expected), 4-GPU tasks (1/4, 1000), CPU-only
        // tasks (1/4, no GPU): multi-GPU tasks make 1000 of the 1250 milli requested.
        let gpu = ResourceName::nvidia_gpu();
        let mix = WorkloadMix::new(vec![
            (shape(1000, Some(GpuRequest::shared(gpu.clone(), 500))), 0.5),
            (shape(8000, Some(GpuRequest::devices(gpu.clone(), 4))), 0.25),
            (shape(2000, None), 0.25),
        ]);
        assert!((mix.multi_device_share() - 0.8).abs() < 1e-12);
        // 2-GPU tasks at 5%, whole GPUs at 95%: 100 of 1050 milli, under a tenth.
        let few = WorkloadMix::new(vec![
            (shape(1000, Some(GpuRequest::devices(gpu.clone(), 2))), 0.05),
            (shape(1000, Some(GpuRequest::devices(gpu, 1))), 0.95),
        ]);
        assert!((few.multi_device_share() - 100.0 / 1050.0).abs() < 1e-12);
        assert!(WorkloadMix::new(vec![(shape(1000, None), 1.0)]).multi_device_share() == 0.0);
    }

    #[test]
    fn per_copy_divides_each_gpu_class_by_its_request_in_gpus() {
        // Half-GPU 1/2 → 1/2 ÷ 0.5 = 1; 4-GPU 1/4 → 1/16; CPU-only 1/4 stays: sum 21/16, so
        // 16/21, 1/21 and 4/21.
        let gpu = ResourceName::nvidia_gpu();
        let mix = WorkloadMix::new(vec![
            (shape(1000, Some(GpuRequest::shared(gpu.clone(), 500))), 0.5),
            (shape(8000, Some(GpuRequest::devices(gpu, 4))), 0.25),
            (shape(2000, None), 0.25),
        ]);
        let shares: Vec<f64> = mix.per_copy().classes().iter().map(|(_, p)| *p).collect();
        let expected = [16.0 / 21.0, 1.0 / 21.0, 4.0 / 21.0];
        assert_eq!(shares.len(), 3);
        for (share, want) in shares.iter().zip(expected) {
            assert!((share - want).abs() < 1e-12, "{shares:?}");
        }
        // The shapes and their order are kept.
        assert_eq!(mix.per_copy().classes()[1].0, mix.classes()[1].0);
        assert!(WorkloadMix::default().per_copy().is_empty());
    }

    #[test]
    fn fragmentation_counts_what_the_mix_cannot_use() {
        // One class: a half GPU with 1 CPU; the node has devices free 1000, 300, 0.
        let gpu = ResourceName::nvidia_gpu();
        let mix = WorkloadMix::new(vec![(
            shape(1000, Some(GpuRequest::shared(gpu.clone(), 500))),
            1.0,
        )]);
        let index = FragIndex::new(&mix, &[], |r| (r == &gpu).then_some(ResourceId(0)));
        let free = [1000u16, 300, 0];
        let layout = [PoolLayout {
            resource: ResourceId(0),
            start: 0,
            len: 3,
            memory_mib: None,
            sharing: crate::model::Sharing::Exclusive,
        }];
        let f = index.node_fragmentation(None, 8000, &layout, &free);
        assert!(
            (f - 300.0).abs() < 1e-9,
            "only the 300 left on the second GPU is a fragment, got {f}"
        );
        let no_cpu = index.node_fragmentation(None, 500, &layout, &free);
        assert!(
            (no_cpu - 1300.0).abs() < 1e-9,
            "without CPU for the class, all idle GPU is a fragment"
        );
    }

    /// One pool of `len` devices of resource 0, the mix compiled for it.
    fn pool(mix: &WorkloadMix, len: u16) -> (FragIndex, [PoolLayout; 1]) {
        let gpu = ResourceName::nvidia_gpu();
        let index = FragIndex::new(mix, &[], |r| (r == &gpu).then_some(ResourceId(0)));
        let layout = [PoolLayout {
            resource: ResourceId(0),
            start: 0,
            len,
            memory_mib: None,
            sharing: crate::model::Sharing::Exclusive,
        }];
        (index, layout)
    }

    fn assert_milli(got: f64, want: f64, why: &str) {
        assert!((got - want).abs() < 1e-9, "{why}: want {want}, got {got}");
    }

    #[test]
    fn unfillable_counts_leftovers_inside_a_device() {
        // 470 milli per task: a free device of 1000 holds two (60 stay idle), 300 holds none.
        let gpu = ResourceName::nvidia_gpu();
        let mix = WorkloadMix::new(vec![(shape(1000, Some(GpuRequest::shared(gpu, 470))), 1.0)]);
        let (index, layout) = pool(&mix, 3);
        let free = [1000u16, 300, 0];
        assert_milli(
            index.node_fragmentation(None, 8000, &layout, &free),
            300.0,
            "F_n counts only the device too small",
        );
        assert_milli(
            index.node_unfillable(None, 8000, &layout, &free),
            1300.0 - 940.0,
            "two copies fill 940 of the 1300 idle",
        );
        assert_milli(
            index.node_unfillable(None, 8000, &layout, &[0, 0, 0]),
            0.0,
            "a full node wastes nothing",
        );
    }

    #[test]
    fn unfillable_counts_gpus_whose_cpu_is_gone() {
        // Whole-GPU tasks with 11 cores each; 8 free GPUs but CPU for two tasks.
        let gpu = ResourceName::nvidia_gpu();
        let mix = WorkloadMix::new(vec![(
            shape(11_000, Some(GpuRequest::devices(gpu, 1))),
            1.0,
        )]);
        let (index, layout) = pool(&mix, 8);
        let free = [1000u16; 8];
        assert_milli(
            index.node_fragmentation(None, 22_000, &layout, &free),
            0.0,
            "F_n counts all 8 GPUs as usable once one task fits",
        );
        assert_milli(
            index.node_unfillable(None, 22_000, &layout, &free),
            6000.0,
            "two tasks use two GPUs, six are stranded",
        );
        assert_milli(
            index.node_unfillable(None, 10_999, &layout, &free),
            8000.0,
            "no CPU for one task: all idle GPU is waste",
        );
    }

    #[test]
    fn unfillable_takes_whole_devices_for_multi_gpu_tasks() {
        // Two whole GPUs per task: three free devices hold one copy; the half-free one none.
        let gpu = ResourceName::nvidia_gpu();
        let mix = WorkloadMix::new(vec![(shape(0, Some(GpuRequest::devices(gpu, 2))), 1.0)]);
        let (index, layout) = pool(&mix, 4);
        let free = [1000u16, 1000, 1000, 500];
        assert_milli(
            index.node_fragmentation(None, 8000, &layout, &free),
            500.0,
            "F_n credits all three fitting devices",
        );
        assert_milli(
            index.node_unfillable(None, 8000, &layout, &free),
            1500.0,
            "one copy takes two devices; one whole device and the half stay idle",
        );
    }

    #[test]
    fn unfillable_credits_each_cpu_class_with_the_copies_its_cpu_feeds() {
        // Whole-GPU tasks at 1, 4 and 16 cores (shares 1/2, 1/4, 1/4); 4 free GPUs, 8 cores.
        // 1 core: 4 copies (4000); 4 cores: 2 copies (2000); 16 cores: none.
        // Usable = 0.5·4000 + 0.25·2000 + 0.25·0 = 2500 of 4000 idle.
        let gpu = ResourceName::nvidia_gpu();
        let whole = |cpu| shape(cpu, Some(GpuRequest::devices(gpu.clone(), 1)));
        let mix = WorkloadMix::new(vec![
            (whole(1000), 0.5),
            (whole(4000), 0.25),
            (whole(16_000), 0.25),
        ]);
        let (index, layout) = pool(&mix, 4);
        let free = [1000u16; 4];
        assert_milli(
            index.node_unfillable(None, 8000, &layout, &free),
            1500.0,
            "classes fed for fewer copies than the devices hold",
        );
        assert_milli(
            index.node_fragmentation(None, 8000, &layout, &free),
            1000.0,
            "F_n: the two classes that fit use everything",
        );
    }
}
