//! Group commit ([`GroupCommit`]): what arrives for one record while a write of it is under way
//! waits, and the next write takes all of it at once. The handler that finds no write under way
//! becomes the writer and writes batch after batch until nothing waits; every other handler
//! waits for its own answer. The rollout's site reports and the install saga's events are
//! written this way.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// Items waiting for a write, by the key of the record they change; `A` is what each is
/// answered.
pub(crate) struct GroupCommit<I, A> {
    batches: Mutex<HashMap<String, Batch<I, A>>>,
}

impl<I, A> Default for GroupCommit<I, A> {
    fn default() -> Self {
        Self { batches: Mutex::default() }
    }
}

/// The items of one key waiting for a write; `writing` while a handler writes the key, which
/// takes what arrives meanwhile in its next write.
struct Batch<I, A> {
    waiting: Vec<(I, oneshot::Sender<A>)>,
    writing: bool,
}

impl<I, A> Default for Batch<I, A> {
    fn default() -> Self {
        Self { waiting: Vec::new(), writing: false }
    }
}

impl<I, A> GroupCommit<I, A> {
    /// Hands `item` to the next write of `key`, writing it (and what arrives meanwhile) here
    /// when no write of `key` is under way: `write` takes a batch, in arrival order, and answers
    /// each item of it, in the same order. `None` when the write that took `item` ended without
    /// answering it (it panicked).
    pub(crate) async fn submit<F, Fut>(&self, key: &str, item: I, mut write: F) -> Option<A>
    where
        F: FnMut(Vec<I>) -> Fut,
        Fut: Future<Output = Vec<A>>,
    {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut batches = self.batches.lock().expect("group commit lock");
            let batch = batches.entry(key.to_string()).or_default();
            batch.waiting.push((item, tx));
            !std::mem::replace(&mut batch.writing, true)
        };
        if lead {
            let mut writer = Writer { batches: &self.batches, key, done: false };
            loop {
                let batch = {
                    let mut batches = self.batches.lock().expect("group commit lock");
                    let Some(b) = batches.get_mut(key) else { break };
                    if b.waiting.is_empty() {
                        batches.remove(key);
                        writer.done = true;
                        break;
                    }
                    std::mem::take(&mut b.waiting)
                };
                let (items, answer_to): (Vec<I>, Vec<_>) = batch.into_iter().unzip();
                for (answer, tx) in write(items).await.into_iter().zip(answer_to) {
                    let _ = tx.send(answer);
                }
            }
        }
        rx.await.ok()
    }
}

/// The handler writing a key's batches. Should it end before the last (a panic), the items
/// left waiting are let go (their senders dropped): their handlers fail and are tried again,
/// instead of waiting for a writer that is gone.
struct Writer<'a, I, A> {
    batches: &'a Mutex<HashMap<String, Batch<I, A>>>,
    key: &'a str,
    done: bool,
}

impl<I, A> Drop for Writer<'_, I, A> {
    fn drop(&mut self) {
        if !self.done {
            self.batches.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that ends before its last batch lets the items waiting on it go, so their
    /// handlers are tried again; one that finished leaves a newer writer's batch alone.
    #[tokio::test]
    async fn items_waiting_on_a_writer_that_is_gone_are_let_go() {
        let commit = GroupCommit::<u32, ()>::default();
        let waiting = |commit: &GroupCommit<u32, ()>| {
            let (tx, rx) = oneshot::channel();
            commit.batches.lock().unwrap().entry("saga.s1".into()).or_default().waiting.push((1, tx));
            rx
        };
        let rx = waiting(&commit);
        drop(Writer { batches: &commit.batches, key: "saga.s1", done: false });
        assert!(rx.await.is_err(), "the waiting item was let go");
        assert!(commit.batches.lock().unwrap().is_empty());

        let mut rx = waiting(&commit);
        drop(Writer { batches: &commit.batches, key: "saga.s1", done: true });
        assert!(rx.try_recv().is_err_and(|e| e == oneshot::error::TryRecvError::Empty));
        assert_eq!(commit.batches.lock().unwrap()["saga.s1"].waiting.len(), 1);
    }

    /// What arrives while a write is under way goes into the next write, together; each item
    /// gets its own answer.
    #[tokio::test]
    async fn what_arrives_during_a_write_is_written_together_next() {
        let commit = std::sync::Arc::new(GroupCommit::<u32, u32>::default());
        let writes = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (started_tx, started_rx) = oneshot::channel::<()>();
        let (go_tx, go_rx) = oneshot::channel::<()>();
        let lead = {
            let (commit, writes) = (commit.clone(), writes.clone());
            let mut gate = Some((started_tx, go_rx));
            tokio::spawn(async move {
                commit
                    .submit("k", 1, |batch: Vec<u32>| {
                        let gate = gate.take();
                        let writes = writes.clone();
                        async move {
                            if let Some((started, go)) = gate {
                                let _ = started.send(());
                                let _ = go.await;
                            }
                            writes.lock().unwrap().push(batch.clone());
                            batch.iter().map(|i| i * 10).collect()
                        }
                    })
                    .await
            })
        };
        started_rx.await.unwrap();
        let follow = |i: u32| {
            let commit = commit.clone();
            tokio::spawn(async move { commit.submit("k", i, |_| async { panic!("not the writer") }).await })
        };
        let (two, three) = (follow(2), follow(3));
        tokio::task::yield_now().await;
        while commit.batches.lock().unwrap()["k"].waiting.len() < 2 {
            tokio::task::yield_now().await;
        }
        go_tx.send(()).unwrap();
        assert_eq!(lead.await.unwrap(), Some(10));
        assert_eq!((two.await.unwrap(), three.await.unwrap()), (Some(20), Some(30)));
        assert_eq!(*writes.lock().unwrap(), [vec![1], vec![2, 3]]);
        assert!(commit.batches.lock().unwrap().is_empty());
    }
}
