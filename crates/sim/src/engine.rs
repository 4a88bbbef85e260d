//! The discrete-event engine: a simulated clock and a queue of future events.
//!
//! Nothing here reads the wall clock. Events due at the same instant are delivered in the order
//! they were scheduled, so a run is a pure function of its inputs and seed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt;
use std::time::Duration;

/// A point on the simulated clock: microseconds since the start of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimTime(u64);

impl SimTime {
    /// The start of the run.
    pub const ZERO: SimTime = SimTime(0);

    /// The instant `elapsed` after the start.
    pub fn from_duration(elapsed: Duration) -> Self {
        SimTime(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX))
    }

    /// The instant `secs` seconds after the start (negative and NaN read as zero).
    pub fn from_secs_f64(secs: f64) -> Self {
        Self::from_duration(Duration::try_from_secs_f64(secs).unwrap_or_default())
    }

    /// Seconds since the start.
    #[allow(clippy::cast_precision_loss)] // microsecond counts stay far below 2^52 in any run
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// Hours since the start.
    pub fn as_hours_f64(self) -> f64 {
        self.as_secs_f64() / 3600.0
    }

    /// This instant plus `delay`, saturating at the end of time.
    #[must_use]
    pub fn after(self, delay: Duration) -> Self {
        SimTime(self.0.saturating_add(Self::from_duration(delay).0))
    }

    /// How long after `earlier` this instant is (zero if it is not later).
    pub fn since(self, earlier: SimTime) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{:.3}s", self.as_secs_f64())
    }
}

/// An event waiting in the queue. Ordered so that the heap pops the earliest, and among equal
/// times the first scheduled.
#[derive(Debug)]
struct Pending<E> {
    at: SimTime,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Pending<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<E> Eq for Pending<E> {}

impl<E> PartialOrd for Pending<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Pending<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` is a max-heap and we want the earliest first.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The simulated clock and its future events.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Pending<E>>,
    now: SimTime,
    next_seq: u64,
    delivered: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            now: SimTime::ZERO,
            next_seq: 0,
            delivered: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// An empty queue at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current simulated time: the time of the last delivered event.
    pub fn now(&self) -> SimTime {
        self.now
    }

    /// Schedules `event` at `at`. An instant in the past is delivered now: the clock never runs
    /// backwards.
    pub fn schedule_at(&mut self, at: SimTime, event: E) {
        let at = at.max(self.now);
        self.heap.push(Pending {
            at,
            seq: self.next_seq,
            event,
        });
        self.next_seq += 1;
    }

    /// Delivers the next event and moves the clock to its time.
    pub fn pop(&mut self) -> Option<(SimTime, E)> {
        let Pending { at, event, .. } = self.heap.pop()?;
        self.now = at;
        self.delivered += 1;
        Some((at, event))
    }

    /// The time of the next event, if any.
    pub fn next_time(&self) -> Option<SimTime> {
        self.heap.peek().map(|p| p.at)
    }

    /// Events still waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Events delivered so far, for the events-per-second figure.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    #[test]
    fn delivers_in_time_order_then_schedule_order() {
        let mut queue = EventQueue::new();
        queue.schedule_at(SimTime::from_secs_f64(5.0), "late");
        queue.schedule_at(SimTime::from_secs_f64(1.0), "first");
        queue.schedule_at(SimTime::from_secs_f64(1.0), "second");
        queue.schedule_at(SimTime::from_secs_f64(0.5), "earliest");
        let order: Vec<_> = std::iter::from_fn(|| queue.pop()).map(|(_, e)| e).collect();
        assert_eq!(order, vec!["earliest", "first", "second", "late"]);
        assert_eq!(queue.now(), SimTime::from_secs_f64(5.0));
        assert_eq!(queue.delivered(), 4);
    }

    #[test]
    fn clock_never_runs_backwards() {
        let mut queue = EventQueue::new();
        queue.schedule_at(SimTime::from_secs_f64(10.0), 1);
        assert_eq!(
            queue.pop().map(|(t, _)| t),
            Some(SimTime::from_secs_f64(10.0))
        );
        queue.schedule_at(SimTime::from_secs_f64(2.0), 2);
        assert_eq!(queue.next_time(), Some(SimTime::from_secs_f64(10.0)));
        assert_eq!(queue.pop(), Some((SimTime::from_secs_f64(10.0), 2)));
        assert!(queue.is_empty());
    }

    #[test]
    fn time_arithmetic() {
        let t = SimTime::from_secs_f64(1.5).after(Duration::from_millis(250));
        assert_eq!(
            t.since(SimTime::from_secs_f64(1.0)),
            Duration::from_millis(750)
        );
        assert_eq!(SimTime::ZERO.since(t), Duration::ZERO);
        assert_eq!(SimTime::from_secs_f64(-3.0), SimTime::ZERO);
        assert_eq!(t.to_string(), "t+1.750s");
        assert!((SimTime::from_secs_f64(7200.0).as_hours_f64() - 2.0).abs() < 1e-12);
    }
}
