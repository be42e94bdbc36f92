//! Keeping messages that share a key in stream order while others run concurrently
//! ([`KeyedOrder`], for [`super::ConsumerSpec::ordered_by_token`]).

type Done = futures::future::Shared<tokio::sync::oneshot::Receiver<()>>;

/// Chains messages by key: each waits for the one before it with the same key. A message
/// whose key is the barrier waits for every message before it, and every later one waits for it.
#[derive(Default)]
pub(super) struct KeyedOrder {
    last: std::collections::HashMap<String, Done>,
    barrier: Option<Done>,
}

impl KeyedOrder {
    /// What a message with `key` waits for before it is handled, and what it drops once handled.
    pub(super) fn enqueue(
        &mut self,
        key: Option<String>,
        barrier: Option<&str>,
    ) -> (Vec<Done>, Option<tokio::sync::oneshot::Sender<()>>) {
        use futures::FutureExt;
        let Some(key) = key else { return (Vec::new(), None) };
        // Forget keys whose last message is done, so the map stays as small as the work in flight.
        if self.last.len() > 1024 {
            self.last.retain(|_, done| done.peek().is_none());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let done = rx.shared();
        let mut wait: Vec<Done> = self.barrier.iter().cloned().collect();
        if barrier == Some(key.as_str()) {
            wait.extend(self.last.drain().map(|(_, d)| d));
            self.barrier = Some(done);
        } else if let Some(previous) = self.last.insert(key, done) {
            wait.push(previous);
        }
        (wait, Some(tx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keyed_order_chains_keys_and_barriers() {
        let mut order = KeyedOrder::default();
        let (w, a1) = order.enqueue(Some("a".into()), Some("fleet"));
        assert!(w.is_empty());
        let (w, b1) = order.enqueue(Some("b".into()), Some("fleet"));
        assert!(w.is_empty(), "other keys run concurrently");
        let (w, _a2) = order.enqueue(Some("a".into()), Some("fleet"));
        assert_eq!(w.len(), 1, "same key waits");
        let (w, f) = order.enqueue(Some("fleet".into()), Some("fleet"));
        assert_eq!(w.len(), 2, "a barrier waits for the last of every key");
        let (w, _c) = order.enqueue(Some("c".into()), Some("fleet"));
        assert_eq!(w.len(), 1, "everything after a barrier waits for it");
        drop((a1, b1));
        let (w, _) = order.enqueue(None, Some("fleet"));
        assert!(w.is_empty(), "unkeyed messages are not ordered");
        drop(f);
    }
}
