//! The simulated engine behind one fake server: a continuous-batching scheduler that produces one
//! token per running request per step, the pause / sleep / shutdown state machine, and the
//! write-through KV offloader whose counters the operator watches settle.
//!
//! States: `Running` → `Paused{mode}` → `Running` (resume); `Running` → `Sleeping{level, tags}` →
//! `Running` (all tags woken); any → `ShuttingDown{deadline}` → `Exited`. As in vLLM, requests
//! that arrive while paused or asleep are held at the door (not in the engine, so not counted in
//! `vllm:num_requests_*`) until resume.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::config::Config;

/// What `POST /pause?mode=` does with in-flight requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// End them now; clients get their partial output with `finish_reason: "abort"`.
    Abort,
    /// Let them finish; `/pause` answers once they have.
    Wait,
    /// Freeze them in the scheduler, KV on the GPU; they continue after `/resume`.
    Keep,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended the text.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Aborted: pause(abort), `/abort_requests`, client disconnect or shutdown.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// What a request's consumer receives from the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenEvent {
    /// One generated token's text.
    Token(String),
    /// The request left the engine.
    Finished(FinishReason),
}

/// The two memory pools `/sleep` and `/wake_up` act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SleepTag {
    Weights,
    KvCache,
}

/// Where the model weights are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Weights {
    /// On the GPU and valid.
    Loaded,
    /// Copied to host memory by a level-1 sleep.
    Offloaded,
    /// Thrown away by a level-2 sleep; waking gives garbage until `reload_weights`.
    Discarded,
}

/// Why a request was not let in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Why `/sleep` failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SleepError {
    #[error("Sleep mode is not enabled in the model config")]
    NotEnabled,
}

/// The state as `/metrics`, `/is_paused`, `/is_sleeping` and `/_fake/state` report it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    pub phase: Phase,
    pub pause_mode: Option<PauseMode>,
    pub sleep_level: Option<u8>,
    pub sleeping_tags: Vec<SleepTag>,
    pub weights: Weights,
    /// Output is garbage: woken from level 2 without `reload_weights` and `reset_prefix_cache`.
    pub incoherent: bool,
    pub engine_dead: bool,
    /// Requests in model execution batches, including aborted ones the engine has not dropped yet.
    pub running: usize,
    pub waiting: usize,
    pub kv_cache_usage: f64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub preemptions_total: u64,
    pub finished_stop: u64,
    pub finished_length: u64,
    pub finished_abort: u64,
    pub offload_bytes_total: u64,
    pub offload_seconds_total: f64,
    pub offload_pending_bytes: u64,
    /// HTTP generation requests in flight (`/load`).
    pub server_load: usize,
    /// Engine steps taken, paused or not: a test that something does not happen over some
    /// steps waits for them, not for a time a starved runtime may not step in.
    pub steps: u64,
}

/// The coarse state-machine phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Running,
    Paused,
    Sleeping,
    ShuttingDown,
    Exited,
}

/// Whether requests may enter the engine now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Door {
    Open,
    Held,
    Closed,
}

#[derive(Debug)]
enum Slot {
    Waiting,
    Running,
}

#[derive(Debug)]
struct Request {
    prompt_tokens: u32,
    generated: u32,
    max_tokens: u32,
    slot: Slot,
    events: mpsc::UnboundedSender<GenEvent>,
}

#[derive(Debug)]
struct Sleep {
    level: u8,
    tags: BTreeSet<SleepTag>,
}

#[derive(Debug)]
#[allow(clippy::struct_excessive_bools)] // independent facts, not a hidden state machine
struct State {
    requests: BTreeMap<u64, Request>,
    next_id: u64,
    /// Aborted requests still counted by the gauges until the engine catches up: (until, was running).
    draining: Vec<(Instant, bool)>,
    paused: Option<PauseMode>,
    pause_waiters: Vec<oneshot::Sender<()>>,
    sleep: Option<Sleep>,
    weights: Weights,
    needs_reload: bool,
    needs_prefix_reset: bool,
    shutdown_deadline: Option<Instant>,
    exited: bool,
    engine_dead: bool,
    prompt_tokens_total: u64,
    generation_tokens_total: u64,
    preemptions_total: u64,
    finished: [u64; 3],
    offload_pending: u64,
    offload_total: u64,
    offload_seconds: f64,
    last_step: Instant,
    steps: u64,
    server_load: usize,
}

/// One simulated engine; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    state: Mutex<State>,
    /// Wakes the stepper when work arrives.
    work: Notify,
    door: watch::Sender<Door>,
    exited: watch::Sender<bool>,
}

impl Engine {
    pub fn new(config: Config) -> Arc<Self> {
        let state = State {
            requests: BTreeMap::new(),
            next_id: 0,
            draining: Vec::new(),
            paused: None,
            pause_waiters: Vec::new(),
            sleep: None,
            weights: Weights::Loaded,
            needs_reload: false,
            needs_prefix_reset: false,
            shutdown_deadline: None,
            exited: false,
            engine_dead: false,
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
            preemptions_total: 0,
            finished: [0; 3],
            offload_pending: 0,
            offload_total: 0,
            offload_seconds: 0.0,
            last_step: Instant::now(),
            steps: 0,
            server_load: 0,
        };
        Arc::new(Self {
            config,
            state: Mutex::new(state),
            work: Notify::new(),
            door: watch::channel(Door::Open).0,
            exited: watch::channel(false).0,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the counters inconsistent in a way that
        // matters to a test double; keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Recomputes the door after a state change and wakes the stepper.
    fn changed(&self, state: &State) {
        let door = door_of(state);
        self.door.send_if_modified(|current| {
            let modified = *current != door;
            *current = door;
            modified
        });
        self.work.notify_one();
    }

    /// Waits until a new request may enter: held while paused or asleep, refused while shutting
    /// down.
    async fn wait_for_door(&self) -> Result<(), Refused> {
        let mut door = self.door.subscribe();
        loop {
            match *door.borrow_and_update() {
                Door::Open => return Ok(()),
                Door::Closed => return Err(Refused::ShuttingDown),
                Door::Held => {}
            }
            if door.changed().await.is_err() {
                return Err(Refused::ShuttingDown);
            }
        }
    }

    /// Puts a request into the engine's waiting queue once the door is open: held while paused
    /// or asleep, refused while shutting down. The door is checked again under the lock so a
    /// pause that lands in between holds the request instead of letting it in.
    pub async fn admit(
        &self,
        prompt_tokens: u32,
        max_tokens: u32,
    ) -> Result<(u64, mpsc::UnboundedReceiver<GenEvent>), Refused> {
        loop {
            self.wait_for_door().await?;
            let mut state = self.lock();
            if door_of(&state) != Door::Open {
                continue;
            }
            let (events, receiver) = mpsc::unbounded_channel();
            let id = state.next_id;
            state.next_id += 1;
            state.requests.insert(
                id,
                Request {
                    prompt_tokens,
                    generated: 0,
                    max_tokens,
                    slot: Slot::Waiting,
                    events,
                },
            );
            self.changed(&state);
            return Ok((id, receiver));
        }
    }

    /// Aborts the given requests, or all when `ids` is `None`; returns how many were in flight.
    pub fn abort(&self, ids: Option<&[u64]>) -> usize {
        let mut state = self.lock();
        let now = Instant::now();
        let chosen: Vec<u64> = match ids {
            None => state.requests.keys().copied().collect(),
            Some(ids) => ids
                .iter()
                .copied()
                .filter(|id| state.requests.contains_key(id))
                .collect(),
        };
        for id in &chosen {
            abort_request(&mut state, *id, now + self.config.abort_lag);
        }
        self.changed(&state);
        chosen.len()
    }

    /// `POST /pause`: holds new requests, then applies `mode` to in-flight ones. With `wait`,
    /// returns once they have finished.
    pub async fn pause(&self, mode: PauseMode, clear_cache: bool) {
        tokio::time::sleep(self.config.pause_latency).await;
        if let Some(finished) = self.apply_pause(mode, clear_cache) {
            // A dropped sender means the engine exited; the pause is moot then.
            let _ = finished.await;
        }
    }

    /// Pauses now; returns what to await for `wait` while requests are still in flight.
    fn apply_pause(&self, mode: PauseMode, clear_cache: bool) -> Option<oneshot::Receiver<()>> {
        let mut state = self.lock();
        state.paused = Some(mode);
        let now = Instant::now();
        match mode {
            PauseMode::Abort => {
                let ids: Vec<u64> = state.requests.keys().copied().collect();
                for id in ids {
                    abort_request(&mut state, id, now + self.config.abort_lag);
                }
            }
            // Some releases preempt frozen requests when the cache is cleared (vLLM PR #57970);
            // the newest ignore clear_cache with keep.
            PauseMode::Keep if clear_cache && self.config.profile != crate::Profile::Latest => {
                preempt_running(&mut state);
            }
            PauseMode::Keep | PauseMode::Wait => {}
        }
        let receiver = if mode == PauseMode::Wait && !state.requests.is_empty() {
            let (sender, receiver) = oneshot::channel();
            state.pause_waiters.push(sender);
            Some(receiver)
        } else {
            None
        };
        self.changed(&state);
        receiver
    }

    /// `POST /resume`.
    pub fn resume(&self) {
        let mut state = self.lock();
        state.paused = None;
        for waiter in state.pause_waiters.drain(..) {
            let _ = waiter.send(());
        }
        self.changed(&state);
    }

    /// `POST /sleep`: pauses with `mode` (older releases always abort), discards the KV cache
    /// (frozen requests lose theirs and are preempted) and, at level 1, offloads the weights; at
    /// level 2 discards them. Level 0 only pauses scheduling. Wake-up resumes.
    pub async fn sleep(
        &self,
        level: u8,
        tags: &[SleepTag],
        mode: PauseMode,
    ) -> Result<(), SleepError> {
        if !self.config.enable_sleep_mode {
            return Err(SleepError::NotEnabled);
        }
        if let Some(finished) = self.apply_pause(mode, false) {
            let _ = finished.await;
        }
        let latency = match level {
            0 => Duration::ZERO,
            1 => self.config.sleep_l1_latency,
            _ => self.config.sleep_l2_latency,
        };
        tokio::time::sleep(latency).await;
        let mut state = self.lock();
        let tags: BTreeSet<SleepTag> = if tags.is_empty() {
            [SleepTag::Weights, SleepTag::KvCache].into()
        } else {
            tags.iter().copied().collect()
        };
        if level >= 1 && tags.contains(&SleepTag::KvCache) {
            preempt_running(&mut state);
        }
        if level >= 1 && tags.contains(&SleepTag::Weights) {
            state.weights = if level == 1 {
                Weights::Offloaded
            } else {
                Weights::Discarded
            };
        }
        if level >= 2 {
            state.needs_reload = tags.contains(&SleepTag::Weights);
            state.needs_prefix_reset = true;
        }
        let tags = if level == 0 { BTreeSet::new() } else { tags };
        state.sleep = Some(Sleep { level, tags });
        self.changed(&state);
        Ok(())
    }

    /// `POST /wake_up`: wakes the given tags (all when empty); the engine runs again once no tag
    /// sleeps.
    pub async fn wake(&self, tags: &[SleepTag]) {
        tokio::time::sleep(self.config.wake_latency).await;
        let mut state = self.lock();
        let Some(sleep) = state.sleep.as_mut() else {
            return;
        };
        if tags.is_empty() {
            sleep.tags.clear();
        } else {
            for tag in tags {
                sleep.tags.remove(tag);
            }
        }
        let weights_awake = !sleep.tags.contains(&SleepTag::Weights);
        let all_awake = sleep.tags.is_empty();
        if weights_awake && state.weights == Weights::Offloaded {
            state.weights = Weights::Loaded;
        }
        if all_awake {
            state.sleep = None;
            state.paused = None;
            for waiter in state.pause_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
        self.changed(&state);
    }

    /// `POST /collective_rpc {"method": "reload_weights"}`: only meaningful once the weights are
    /// awake, as upstream.
    pub fn reload_weights(&self) {
        let mut state = self.lock();
        let weights_asleep = state
            .sleep
            .as_ref()
            .is_some_and(|sleep| sleep.tags.contains(&SleepTag::Weights));
        if !weights_asleep {
            state.weights = Weights::Loaded;
            state.needs_reload = false;
        }
        self.changed(&state);
    }

    /// `POST /reset_prefix_cache`: only meaningful once the KV cache is awake.
    pub fn reset_prefix_cache(&self) {
        let mut state = self.lock();
        let kv_asleep = state
            .sleep
            .as_ref()
            .is_some_and(|sleep| sleep.tags.contains(&SleepTag::KvCache));
        if !kv_asleep {
            state.needs_prefix_reset = false;
        }
        self.changed(&state);
    }

    /// Emulates SIGTERM with `--shutdown-timeout drain`: new requests are refused, in-flight ones
    /// get until the deadline, then are aborted and the engine exits.
    pub fn begin_shutdown(&self, drain: Duration) {
        let mut state = self.lock();
        if state.shutdown_deadline.is_none() && !state.exited {
            state.shutdown_deadline = Some(Instant::now() + drain);
        }
        self.changed(&state);
    }

    /// Resolves once the engine has exited after a shutdown.
    pub async fn exited(&self) {
        let mut exited = self.exited.subscribe();
        // An error means the engine is gone, which is exited enough.
        let _ = exited.wait_for(|exited| *exited).await;
    }

    /// `/health` answers 503 while dead (vLLM's `EngineDeadError`).
    pub fn set_dead(&self, dead: bool) {
        self.lock().engine_dead = dead;
    }

    /// Counts an HTTP generation request in `/load` until the returned guard drops.
    pub fn track_load(self: &Arc<Self>) -> LoadGuard {
        self.lock().server_load += 1;
        LoadGuard {
            engine: Arc::clone(self),
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        let mut running = 0;
        let mut waiting = 0;
        let mut kv_tokens = 0u64;
        for request in state.requests.values() {
            match request.slot {
                Slot::Running => {
                    running += 1;
                    kv_tokens += u64::from(request.prompt_tokens + request.generated);
                }
                Slot::Waiting => waiting += 1,
            }
        }
        for (_, was_running) in &state.draining {
            if *was_running {
                running += 1;
            } else {
                waiting += 1;
            }
        }
        let capacity = u64::from(self.config.num_gpu_blocks) * u64::from(self.config.block_size);
        #[allow(clippy::cast_precision_loss)] // token counts are far below 2^52
        let kv_cache_usage = if capacity == 0 {
            0.0
        } else {
            (kv_tokens.min(capacity) as f64) / capacity as f64
        };
        let phase = if state.exited {
            Phase::Exited
        } else if state.shutdown_deadline.is_some() {
            Phase::ShuttingDown
        } else if state.sleep.is_some() {
            Phase::Sleeping
        } else if state.paused.is_some() {
            Phase::Paused
        } else {
            Phase::Running
        };
        Snapshot {
            phase,
            pause_mode: state.paused,
            sleep_level: state.sleep.as_ref().map(|sleep| sleep.level),
            sleeping_tags: state
                .sleep
                .as_ref()
                .map(|sleep| sleep.tags.iter().copied().collect())
                .unwrap_or_default(),
            weights: state.weights,
            incoherent: state.needs_reload || state.needs_prefix_reset,
            engine_dead: state.engine_dead,
            running,
            waiting,
            kv_cache_usage,
            prompt_tokens_total: state.prompt_tokens_total,
            generation_tokens_total: state.generation_tokens_total,
            preemptions_total: state.preemptions_total,
            finished_stop: state.finished[0],
            finished_length: state.finished[1],
            finished_abort: state.finished[2],
            offload_bytes_total: state.offload_total,
            offload_seconds_total: state.offload_seconds,
            offload_pending_bytes: state.offload_pending,
            server_load: state.server_load,
            steps: state.steps,
        }
    }

    /// Runs the engine loop until the engine exits. Spawned once per server.
    pub async fn run(self: Arc<Self>) {
        loop {
            let busy = {
                let state = self.lock();
                if state.exited {
                    return;
                }
                !state.requests.is_empty()
                    || !state.draining.is_empty()
                    || state.offload_pending > 0
                    || state.shutdown_deadline.is_some()
            };
            if busy {
                tokio::time::sleep(self.config.decode_interval).await;
            } else {
                self.work.notified().await;
                self.lock().last_step = Instant::now();
                continue;
            }
            self.step(Instant::now());
        }
    }

    /// One engine step at `now`.
    fn step(&self, now: Instant) {
        let config = &self.config;
        let mut state = self.lock();
        let elapsed = now.saturating_duration_since(state.last_step);
        state.last_step = now;
        state.steps += 1;

        state.draining.retain(|(until, _)| *until > now);
        offload(&mut state, config, elapsed);

        let scheduling = state.sleep.is_none() && state.paused != Some(PauseMode::Keep);
        if scheduling {
            schedule(&mut state, config);
        }

        if state.requests.is_empty() && state.paused == Some(PauseMode::Wait) {
            for waiter in state.pause_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }

        if let Some(deadline) = state.shutdown_deadline
            && (now >= deadline || state.requests.is_empty())
        {
            let ids: Vec<u64> = state.requests.keys().copied().collect();
            for id in ids {
                abort_request(&mut state, id, now);
            }
            state.draining.clear();
            state.exited = true;
            state.pause_waiters.clear();
            self.exited.send_replace(true);
        }
        self.changed(&state);
    }
}

fn door_of(state: &State) -> Door {
    if state.shutdown_deadline.is_some() || state.exited {
        Door::Closed
    } else if state.paused.is_some() || state.sleep.is_some() {
        Door::Held
    } else {
        Door::Open
    }
}

/// Decrements `/load` when an HTTP generation request ends.
#[derive(Debug)]
pub struct LoadGuard {
    engine: Arc<Engine>,
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        let mut state = self.engine.lock();
        state.server_load = state.server_load.saturating_sub(1);
    }
}

/// Moves running requests back to the waiting queue; their KV is recomputed when rescheduled.
fn preempt_running(state: &mut State) {
    let mut preempted = 0;
    for request in state.requests.values_mut() {
        if matches!(request.slot, Slot::Running) {
            request.slot = Slot::Waiting;
            preempted += 1;
        }
    }
    state.preemptions_total += preempted;
}

fn abort_request(state: &mut State, id: u64, counted_until: Instant) {
    if let Some(request) = state.requests.remove(&id) {
        let _ = request.events.send(GenEvent::Finished(FinishReason::Abort));
        state.finished[2] += 1;
        state
            .draining
            .push((counted_until, matches!(request.slot, Slot::Running)));
    }
}

/// Admits waiting requests into the batch (prefill), then decodes one token for each running one.
fn schedule(state: &mut State, config: &Config) {
    let block = u64::from(config.block_size.max(1));
    let running = state
        .requests
        .values()
        .filter(|request| matches!(request.slot, Slot::Running))
        .count();
    let mut free = config.max_num_seqs.saturating_sub(running);
    let mut prefilled_tokens = 0u64;
    let mut offload_bytes = 0u64;
    for request in state.requests.values_mut() {
        if free == 0 {
            break;
        }
        if matches!(request.slot, Slot::Waiting) {
            request.slot = Slot::Running;
            free -= 1;
            let prompt = u64::from(request.prompt_tokens);
            prefilled_tokens += prompt;
            if config.kv_offload {
                offload_bytes += (prompt / block) * block * config.bytes_per_token;
            }
        }
    }
    state.prompt_tokens_total += prefilled_tokens;

    let incoherent = state.needs_reload || state.needs_prefix_reset;
    let mut done = Vec::new();
    let mut generated = 0u64;
    for (id, request) in &mut state.requests {
        if !matches!(request.slot, Slot::Running) {
            continue;
        }
        let position = request.generated;
        request.generated += 1;
        generated += 1;
        let _ = request
            .events
            .send(GenEvent::Token(token_text(position, incoherent)));
        let total = u64::from(request.prompt_tokens + request.generated);
        if config.kv_offload && !config.offload_prompt_only && total % block == 0 {
            offload_bytes += block * config.bytes_per_token;
        }
        if request.generated >= request.max_tokens {
            done.push((*id, FinishReason::Length));
        } else if request.generated >= config.natural_length {
            done.push((*id, FinishReason::Stop));
        }
    }
    state.generation_tokens_total += generated;
    state.offload_pending += offload_bytes;
    for (id, reason) in done {
        if let Some(request) = state.requests.remove(&id) {
            let _ = request.events.send(GenEvent::Finished(reason));
            state.finished[usize::from(reason != FinishReason::Stop)] += 1;
        }
    }
}

/// Moves pending KV bytes to the offload tier at the configured bandwidth.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
fn offload(state: &mut State, config: &Config, elapsed: Duration) {
    if state.offload_pending == 0 || config.offload_bandwidth == 0 {
        return;
    }
    let budget = (config.offload_bandwidth as f64 * elapsed.as_secs_f64()).ceil() as u64;
    let moved = state.offload_pending.min(budget.max(1));
    state.offload_pending -= moved;
    state.offload_total += moved;
    state.offload_seconds += moved as f64 / config.offload_bandwidth as f64;
}

const WORDS: [&str; 12] = [
    " the",
    " queue",
    " hands",
    " borrowed",
    " GPUs",
    " back",
    " within",
    " its",
    " budget",
    " and",
    " nothing",
    " breaks",
];

/// The text of the token at `position`: a fixed sentence, or replacement characters when the
/// weights or prefix cache are stale.
fn token_text(position: u32, incoherent: bool) -> String {
    if incoherent {
        "\u{fffd}".to_owned()
    } else {
        WORDS[position as usize % WORDS.len()].to_owned()
    }
}
