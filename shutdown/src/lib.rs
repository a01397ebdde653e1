//! One shutdown for every Skiff component.
//!
//! A [`Shutdown`] is a cancellation token and the set of tasks that must
//! end before the component that owns them has stopped (tokio-util's
//! `CancellationToken` and `TaskTracker`, as mini-redis's `shutdown.rs`
//! does by hand). A component takes one in `run(config, shutdown)`,
//! spawns every long-lived task through it, and makes each task end when
//! [`Shutdown::cancelled`] resolves. Whoever owns the shutdown calls
//! [`Shutdown::stop`], which cancels and then waits for every task.
//!
//! A component that must stop its own tasks before something else (the
//! store before the process exits, a master's apiserver after its
//! controllers) takes a [`Shutdown::child`]: cancelling the parent cancels
//! the child, stopping the child leaves the parent running, and the
//! parent's [`Shutdown::stop`] also waits for the child's tasks.
//!
//! # Layout
//! - [`Shutdown`]: the token, the tracker and their operations.
//! - [`signals`]: SIGINT/SIGTERM as a shutdown, for the binaries.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use tokio_util::sync::WaitForCancellationFutureOwned;

/// A cancellation token and the tasks that must end after it fires.
///
/// Cheap to clone: clones share the token and the tracker.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    token: CancellationToken,
    tracker: TaskTracker,
    /// The tracker of each ancestor, so that a parent's `stop` also waits
    /// for tasks spawned on a child: each child task holds a token of
    /// every ancestor's tracker while it runs.
    ancestors: Vec<TaskTracker>,
}

impl Shutdown {
    /// A new shutdown that nothing has cancelled.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// A shutdown that is cancelled with this one (but not the other way
    /// round) and whose tasks this one's [`stop`](Shutdown::stop) also
    /// waits for.
    pub fn child(&self) -> Shutdown {
        let mut ancestors = self.ancestors.clone();
        ancestors.push(self.tracker.clone());
        Shutdown { token: self.token.child_token(), tracker: TaskTracker::new(), ancestors }
    }

    /// Spawns a task that this shutdown waits for. The task itself must
    /// end once [`cancelled`](Shutdown::cancelled) resolves.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let held: Vec<_> = self.ancestors.iter().map(TaskTracker::token).collect();
        self.tracker.spawn(async move {
            let output = task.await;
            drop(held);
            output
        })
    }

    /// Runs blocking work on tokio's blocking pool; this shutdown waits
    /// for it to return.
    pub fn spawn_blocking<F, T>(&self, work: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let held: Vec<_> = self.ancestors.iter().map(TaskTracker::token).collect();
        self.tracker.spawn_blocking(move || {
            let output = work();
            drop(held);
            output
        })
    }

    /// Resolves once the shutdown has begun.
    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    /// [`cancelled`](Shutdown::cancelled) as an owned future, for a task
    /// or a server that outlives this borrow.
    pub fn cancelled_owned(&self) -> WaitForCancellationFutureOwned {
        self.token.clone().cancelled_owned()
    }

    /// Whether the shutdown has begun.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Begins the shutdown without waiting: every task sees
    /// [`cancelled`](Shutdown::cancelled) resolve.
    pub fn cancel(&self) {
        self.token.cancel()
    }

    /// Begins the shutdown and waits until every task spawned through
    /// this shutdown (and its children) has ended. Tasks may still be
    /// spawned while it waits (a task finishing its work may start
    /// another); the wait covers them too.
    pub async fn stop(&self) {
        self.cancel();
        self.wait().await
    }

    /// Waits, without cancelling, until every task has ended after some
    /// other holder cancelled.
    pub async fn wait(&self) {
        self.tracker.close();
        self.tracker.wait().await
    }

    /// [`stop`](Shutdown::stop), giving up after `grace`: returns whether
    /// every task ended in time. Tasks still running are left to the
    /// runtime's own shutdown.
    pub async fn stop_within(&self, grace: Duration) -> bool {
        self.cancel();
        tokio::time::timeout(grace, self.wait()).await.is_ok()
    }

    /// How many of this shutdown's own tasks are still running.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// The underlying token, for APIs that take one.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}

/// Process signals as the trigger of a shutdown.
pub mod signals {
    use super::Shutdown;

    /// Cancels `shutdown` on the first SIGINT (Ctrl-C), SIGTERM or SIGHUP.
    /// The handlers are installed before this returns, so a signal that
    /// arrives while the caller is still starting up is not lost.
    pub fn cancel_on_signals(shutdown: &Shutdown) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let mut hangup = signal(SignalKind::hangup())?;
        let shutdown = shutdown.clone();
        // Not a tracked task: it waits for a signal, not for work.
        tokio::spawn(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
                _ = hangup.recv() => {}
                _ = shutdown.cancelled() => return,
            }
            shutdown.cancel();
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stop_waits_for_every_task_to_finish_its_cleanup() {
        let shutdown = Shutdown::new();
        let cleaned = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let (shutdown2, cleaned) = (shutdown.clone(), cleaned.clone());
            shutdown.spawn(async move {
                shutdown2.cancelled().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                cleaned.fetch_add(1, Ordering::SeqCst);
            });
        }
        shutdown.stop().await;
        assert_eq!(cleaned.load(Ordering::SeqCst), 3);
        assert_eq!(shutdown.running(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_stops_alone_but_a_parent_waits_for_its_children() {
        let parent = Shutdown::new();
        let child = parent.child();
        let done = Arc::new(AtomicUsize::new(0));
        let (c, d) = (child.clone(), done.clone());
        child.spawn(async move {
            c.cancelled().await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            d.fetch_add(1, Ordering::SeqCst);
        });
        // Stopping the child does not cancel the parent.
        let other = parent.child();
        other.stop().await;
        assert!(!parent.is_cancelled());
        // The parent's stop cancels the child and waits for its task.
        parent.stop().await;
        assert!(child.is_cancelled());
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn stop_within_gives_up_on_a_task_that_ignores_the_token() {
        let shutdown = Shutdown::new();
        shutdown.spawn(std::future::pending::<()>());
        assert!(!shutdown.stop_within(Duration::from_secs(2)).await);
        assert!(shutdown.is_cancelled());
    }
}
