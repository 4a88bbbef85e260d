//! Debouncing the change signal of the stores: the admission loop runs once per burst of
//! changes rather than once per watch event. After the first change it waits until the stores
//! have been quiet for `quiet`, but never longer than `max` after that first change, so a
//! steady stream of events cannot hold decisions back indefinitely.

use std::time::Duration;

use tokio::{sync::watch, time::Instant};

/// How long to wait for a burst to settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debounce {
    pub quiet: Duration,
    pub max: Duration,
}

impl Debounce {
    /// Waits for the next burst of changes and returns when it has settled; `false` once the
    /// signal is closed (the stores are gone). A change that arrived before the call counts.
    pub async fn next_burst(&self, changes: &mut watch::Receiver<u64>) -> bool {
        if changes.changed().await.is_err() {
            return false;
        }
        let deadline = Instant::now() + self.max;
        loop {
            let settle = (Instant::now() + self.quiet).min(deadline);
            tokio::select! {
                next = changes.changed() => if next.is_err() { return true },
                () = tokio::time::sleep_until(settle) => return true,
            }
            if Instant::now() >= deadline {
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBOUNCE: Debounce = Debounce {
        quiet: Duration::from_millis(50),
        max: Duration::from_millis(500),
    };

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_decided_once_it_settles() {
        let (signal, mut changes) = watch::channel(0_u64);
        let sender = tokio::spawn(async move {
            for _ in 0..5 {
                signal.send_modify(|n| *n += 1);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            signal
        });
        let start = Instant::now();
        assert!(DEBOUNCE.next_burst(&mut changes).await);
        // Five changes 10 ms apart, then 50 ms of quiet: one burst.
        assert_eq!(start.elapsed(), Duration::from_millis(40 + 50));
        assert_eq!(*changes.borrow_and_update(), 5);
        drop(sender.await.unwrap());
        assert!(
            !DEBOUNCE.next_burst(&mut changes).await,
            "closed signal ends the loop"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_stream_is_cut_at_the_maximum() {
        let (signal, mut changes) = watch::channel(0_u64);
        let _sender = tokio::spawn(async move {
            loop {
                signal.send_modify(|n| *n += 1);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let start = Instant::now();
        assert!(DEBOUNCE.next_burst(&mut changes).await);
        assert_eq!(start.elapsed(), DEBOUNCE.max);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_happens_without_a_change() {
        let (_signal, mut changes) = watch::channel(0_u64);
        let waited =
            tokio::time::timeout(Duration::from_hours(1), DEBOUNCE.next_burst(&mut changes)).await;
        assert!(
            waited.is_err(),
            "no change, no pass: the loop does not poll"
        );
    }
}
