//! When to restart a process of `skiff up`: one [`Supervisor`] per process,
//! an explicit state machine without I/O.
//!
//! `skiff up`'s loop feeds each supervisor the [`Event`]s of its process
//! (started, exited, its back-off is over, stop) with the time they
//! happened, and does the [`Action`] it answers (start the process, send it
//! SIGTERM). A process that exits on its own is started again after a
//! back-off of [`FIRST_DELAY`], doubling up to [`MAX_DELAY`] while it keeps
//! exiting, back to [`FIRST_DELAY`] once it has stayed up for
//! [`STABLE_AFTER`]. Only [`Event::Stop`] (Ctrl-C, SIGTERM or SIGHUP to
//! `skiff up`) ends it for good.

use std::time::Duration;

use tokio::time::Instant;

/// The back-off after the first exit (or the first after a stable run).
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest back-off: a process that cannot start is tried this often.
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// A process that ran this long before it exited is restarted after
/// [`FIRST_DELAY`] again: its exit is news, not the same crash again.
pub const STABLE_AFTER: Duration = Duration::from_secs(60);

/// Where one supervised process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// To be started now; the caller answers with [`Event::Started`] or
    /// [`Event::StartFailed`].
    Starting,
    /// Running since `since`.
    Running { since: Instant },
    /// Exited on its own (or failed to start); started again at `until`.
    Backoff { until: Instant },
    /// Sent SIGTERM; waiting for it to exit.
    Stopping,
    /// Ended for good.
    Stopped,
}

/// What happened to a supervised process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The process was started.
    Started,
    /// The process could not be started.
    StartFailed,
    /// The process exited.
    Exited,
    /// The time of [`State::Backoff`] has come.
    BackoffOver,
    /// `skiff up` is stopping: so must this process.
    Stop,
}

/// What the caller must do after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing: wait for the next event.
    Wait,
    /// Start the process and report [`Event::Started`] or [`Event::StartFailed`].
    Start,
    /// Send the process SIGTERM and report [`Event::Exited`] once it has.
    Terminate,
}

/// The state machine of one process.
#[derive(Clone, Debug)]
pub struct Supervisor {
    state: State,
    /// The back-off the next exit gets (unless the run before it was stable).
    next_delay: Duration,
    /// How many times the process has been started, the first included.
    starts: u32,
}

impl Default for Supervisor {
    fn default() -> Self {
        Supervisor { state: State::Starting, next_delay: FIRST_DELAY, starts: 0 }
    }
}

impl Supervisor {
    /// A supervisor of a process yet to be started.
    pub fn new() -> Supervisor {
        Supervisor::default()
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// How many times the process has been started again after its first start.
    pub fn restarts(&self) -> u32 {
        self.starts.saturating_sub(1)
    }

    /// Moves on by `event`, which happened at `now`, and says what to do.
    pub fn step(&mut self, event: Event, now: Instant) -> Action {
        let (state, action) = match (self.state, event) {
            (_, Event::Stop) => match self.state {
                State::Running { .. } | State::Stopping => (State::Stopping, Action::Terminate),
                _ => (State::Stopped, Action::Wait),
            },
            (State::Stopped, _) => (State::Stopped, Action::Wait),
            (State::Stopping, Event::Exited) => (State::Stopped, Action::Wait),
            (State::Starting, Event::Started) => {
                self.starts += 1;
                (State::Running { since: now }, Action::Wait)
            }
            (State::Starting, Event::StartFailed) => (State::Backoff { until: now + self.take_delay() }, Action::Wait),
            (State::Running { since }, Event::Exited) => {
                if now.saturating_duration_since(since) >= STABLE_AFTER {
                    self.next_delay = FIRST_DELAY;
                }
                (State::Backoff { until: now + self.take_delay() }, Action::Wait)
            }
            (State::Backoff { until }, Event::BackoffOver) if now >= until => (State::Starting, Action::Start),
            // Anything else is stale (a timer that fired early, an exit
            // already reported): nothing changes.
            (state, _) => (state, Action::Wait),
        };
        self.state = state;
        action
    }

    /// The back-off to wait now, doubling the next one.
    fn take_delay(&mut self) -> Duration {
        let delay = self.next_delay;
        self.next_delay = (delay * 2).min(MAX_DELAY);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A supervisor whose process has been started at `now`.
    fn running(now: Instant) -> Supervisor {
        let mut s = Supervisor::new();
        assert_eq!(s.step(Event::Started, now), Action::Wait);
        s
    }

    /// Steps `s` through an exit at `now` and the restart its back-off
    /// asks for; returns the back-off.
    fn crash_and_restart(s: &mut Supervisor, now: Instant) -> Duration {
        assert_eq!(s.step(Event::Exited, now), Action::Wait);
        let State::Backoff { until } = s.state() else { panic!("an exit leads to a back-off: {:?}", s.state()) };
        assert_eq!(s.step(Event::Started, until), Action::Wait, "no start before the back-off is over");
        assert_eq!(s.step(Event::BackoffOver, until), Action::Start);
        assert_eq!(s.step(Event::Started, until), Action::Wait);
        assert_eq!(s.state(), State::Running { since: until });
        until - now
    }

    #[test]
    fn a_process_that_keeps_exiting_waits_twice_as_long_each_time_up_to_the_maximum() {
        let mut now = Instant::now();
        let mut s = running(now);
        let mut delays = Vec::new();
        for _ in 0..8 {
            now += Duration::from_millis(100);
            let delay = crash_and_restart(&mut s, now);
            now += delay;
            delays.push(delay.as_secs());
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(s.restarts(), 8);
    }

    #[test]
    fn a_process_that_stayed_up_a_while_is_restarted_after_the_first_delay_again() {
        let mut now = Instant::now();
        let mut s = running(now);
        for _ in 0..4 {
            now += crash_and_restart(&mut s, now);
        }
        now += STABLE_AFTER;
        assert_eq!(crash_and_restart(&mut s, now), FIRST_DELAY);
    }

    #[test]
    fn a_start_that_fails_is_retried_with_back_off() {
        let now = Instant::now();
        let mut s = running(now);
        s.step(Event::Exited, now);
        let State::Backoff { until } = s.state() else { panic!("{:?}", s.state()) };
        assert_eq!(s.step(Event::BackoffOver, until), Action::Start);
        assert_eq!(s.step(Event::StartFailed, until), Action::Wait);
        assert_eq!(s.state(), State::Backoff { until: until + 2 * FIRST_DELAY });
        assert_eq!(s.restarts(), 0, "a start that failed is no restart");
    }

    #[test]
    fn an_early_timer_does_not_start_the_process() {
        let now = Instant::now();
        let mut s = running(now);
        s.step(Event::Exited, now);
        assert_eq!(s.step(Event::BackoffOver, now), Action::Wait);
        assert_eq!(s.state(), State::Backoff { until: now + FIRST_DELAY });
    }

    #[test]
    fn stop_terminates_a_running_process_and_ends_after_its_exit() {
        let now = Instant::now();
        let mut s = running(now);
        assert_eq!(s.step(Event::Stop, now), Action::Terminate);
        assert_eq!(s.state(), State::Stopping);
        assert_eq!(s.step(Event::Exited, now), Action::Wait);
        assert_eq!(s.state(), State::Stopped, "an exit while stopping is no reason to restart");
        assert_eq!(s.step(Event::BackoffOver, now + MAX_DELAY), Action::Wait);
        assert_eq!(s.state(), State::Stopped);
    }

    #[test]
    fn stop_during_back_off_ends_at_once_and_nothing_starts_again() {
        let now = Instant::now();
        let mut s = running(now);
        s.step(Event::Exited, now);
        assert_eq!(s.step(Event::Stop, now), Action::Wait);
        assert_eq!(s.state(), State::Stopped);
        assert_eq!(s.step(Event::BackoffOver, now + MAX_DELAY), Action::Wait);
        assert_eq!(s.state(), State::Stopped);
    }
}
