//! Indices into a snapshot's tables. They are plain numbers, valid for the snapshot that
//! handed them out; the lower layers (devices, ledger, fragmentation) use them without knowing
//! the snapshot.

/// Index of a GPU resource name in a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceId(pub(crate) u16);

/// Index of a GPU model in a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelId(pub(crate) u16);

/// Index of a node in a snapshot (nodes are ordered by name when built).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub(crate) u32);

/// Index of a pod in a snapshot; stable until the pod is removed, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodId(pub(crate) u32);

/// Index of a queue in a snapshot (queues are ordered by name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueId(pub(crate) u16);

macro_rules! index {
    ($($t:ident($n:ty)),*) => {$(
        impl $t {
            /// The position, for indexing caller-side tables.
            pub fn index(self) -> usize {
                self.0 as usize
            }

            /// The id at a table position (saturating: tables never grow that large).
            pub(crate) fn at(index: usize) -> Self {
                Self(<$n>::try_from(index).unwrap_or(<$n>::MAX))
            }
        }
    )*};
}
index!(
    NodeId(u32),
    PodId(u32),
    QueueId(u16),
    ResourceId(u16),
    ModelId(u16)
);
