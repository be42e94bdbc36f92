//! Keeping messages that share a key in stream order while others run concurrently
//! ([`KeyedOrder`], for [`super::ConsumerSpec::ordered_by_token`]).
//!
//! A message takes its turn by its stream sequence, not by when it arrived: one redelivered to
//! this process after a later one of its key (the later one parked, waiting for something) goes
//! first as soon as nothing of its key is running, and the later one waits again.
//!
//! A change wakes only the messages it may let start: the first of the key that stopped or left,
//! the first message of all (a barrier waits to be it), and after a barrier's change the first
//! of every key. Waking every waiting message at each change cost the orchestrator a fifth of its
//! CPU while thousands of sites installed (hundreds of messages waiting, each woken at every
//! message done).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// A message's place: its stream sequence, then the order it arrived in, which keeps places
/// apart whatever the loop hands in (the consume loop itself holds a message once at a time:
/// a delivery of one still in hand is dropped before it takes a place, `settle::InHand`).
type Place = (u64, u64);

/// The messages of a consumer that are ordered, each waiting for its turn, running, or parked
/// (between two attempts: it keeps its place, and nothing behind it with its key starts).
#[derive(Default)]
pub(super) struct KeyedOrder {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<Place, Entry>,
    by_key: HashMap<String, BTreeSet<Place>>,
    barriers: BTreeSet<Place>,
    running_keys: HashSet<String>,
    barrier_running: bool,
    running: usize,
    arrivals: u64,
}

struct Entry {
    key: String,
    barrier: bool,
    running: bool,
    /// Told when a change may have let this message start.
    wake: Arc<Notify>,
}

/// A message's place in a [`KeyedOrder`]; dropping it gives the place up.
pub(super) struct Ticket {
    place: Place,
    order: Arc<KeyedOrder>,
    wake: Arc<Notify>,
}

impl KeyedOrder {
    /// Takes a place for a message with `key` stored at `seq` (`None` when `key` is: unkeyed
    /// messages are not ordered). A message whose key is `barrier` orders against every other.
    pub(super) fn enter(self: &Arc<Self>, key: Option<String>, barrier: Option<&str>, seq: u64) -> Option<Ticket> {
        let key = key?;
        let mut s = self.state.lock().expect("order lock");
        s.arrivals += 1;
        let place = (seq, s.arrivals);
        let is_barrier = barrier == Some(key.as_str());
        if is_barrier {
            s.barriers.insert(place);
        }
        s.by_key.entry(key.clone()).or_default().insert(place);
        let wake = Arc::new(Notify::new());
        s.entries.insert(place, Entry { key, barrier: is_barrier, running: false, wake: wake.clone() });
        Some(Ticket { place, order: self.clone(), wake })
    }
}

impl State {
    /// Whether the message at `place` may start an attempt now.
    fn may_start(&self, place: Place) -> bool {
        let Some(entry) = self.entries.get(&place) else { return false };
        if entry.barrier {
            // Everything before it is settled, and nothing runs.
            return self.running == 0 && self.entries.keys().next() == Some(&place);
        }
        let first_of_key = self.by_key.get(&entry.key).and_then(|p| p.first()) == Some(&place);
        let no_barrier_before = self.barriers.first().is_none_or(|b| *b > place);
        first_of_key && no_barrier_before && !self.barrier_running && !self.running_keys.contains(&entry.key)
    }

    /// Wakes the messages that a change to a message of `key` (a barrier or not) may let start.
    /// A wake that finds no one waiting is kept for the next wait, so none is lost.
    fn wake_after_change(&self, key: &str, barrier: bool) {
        let wake = |place: Option<&Place>| {
            if let Some(entry) = place.and_then(|p| self.entries.get(p)) {
                entry.wake.notify_one();
            }
        };
        wake(self.by_key.get(key).and_then(|p| p.first()));
        wake(self.entries.keys().next());
        if barrier {
            for places in self.by_key.values() {
                wake(places.first());
            }
        }
    }
}

impl Ticket {
    /// Waits until this message may start an attempt, then marks it running.
    pub(super) async fn turn(&self) {
        while !self.try_start() {
            self.wake.notified().await;
        }
    }

    fn try_start(&self) -> bool {
        let mut s = self.order.state.lock().expect("order lock");
        if !s.may_start(self.place) {
            return false;
        }
        let entry = s.entries.get_mut(&self.place).expect("may_start found it");
        entry.running = true;
        let (key, barrier) = (entry.key.clone(), entry.barrier);
        s.running += 1;
        if barrier {
            s.barrier_running = true;
        }
        s.running_keys.insert(key);
        true
    }

    /// The attempt is over; the message keeps its place (it may be parked for another).
    pub(super) fn attempt_done(&self) {
        let mut s = self.order.state.lock().expect("order lock");
        if let Some((key, barrier)) = stop(&mut s, self.place) {
            s.wake_after_change(&key, barrier);
        }
    }
}

/// Marks the message at `place` no longer running; its key and whether it is a barrier, if it
/// was running.
fn stop(s: &mut State, place: Place) -> Option<(String, bool)> {
    let entry = s.entries.get_mut(&place)?;
    if !entry.running {
        return None;
    }
    entry.running = false;
    let (key, barrier) = (entry.key.clone(), entry.barrier);
    s.running -= 1;
    if barrier {
        s.barrier_running = false;
    }
    s.running_keys.remove(&key);
    Some((key, barrier))
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.order.state.lock().expect("order lock");
        stop(&mut s, self.place);
        if let Some(entry) = s.entries.remove(&self.place) {
            if let Some(places) = s.by_key.get_mut(&entry.key) {
                places.remove(&self.place);
                if places.is_empty() {
                    s.by_key.remove(&entry.key);
                }
            }
            if entry.barrier {
                s.barriers.remove(&self.place);
            }
            s.wake_after_change(&entry.key, entry.barrier);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(t: &Ticket) -> bool {
        let s = t.order.state.lock().unwrap();
        s.may_start(t.place)
    }

    #[tokio::test]
    async fn keyed_order_chains_keys_and_barriers() {
        let order = Arc::new(KeyedOrder::default());
        let fleet = Some("fleet");
        let a1 = order.enter(Some("a".into()), fleet, 1).unwrap();
        let b1 = order.enter(Some("b".into()), fleet, 2).unwrap();
        let a2 = order.enter(Some("a".into()), fleet, 3).unwrap();
        let f = order.enter(Some("fleet".into()), fleet, 4).unwrap();
        let c = order.enter(Some("c".into()), fleet, 5).unwrap();
        assert!(ready(&a1) && ready(&b1), "other keys run concurrently");
        assert!(!ready(&a2), "same key waits");
        assert!(!ready(&f), "a barrier waits for everything before it");
        assert!(!ready(&c), "everything after a barrier waits for it");
        assert!(order.enter(None, fleet, 6).is_none(), "unkeyed messages are not ordered");
        a1.turn().await;
        a1.attempt_done();
        assert!(!ready(&a2), "a parked message keeps its place");
        drop(a1);
        assert!(ready(&a2));
        drop((b1, a2));
        assert!(ready(&f));
        f.turn().await;
        drop(f);
        assert!(ready(&c));
    }

    #[tokio::test]
    async fn an_earlier_message_redelivered_passes_a_parked_later_one_of_its_key() {
        let order = Arc::new(KeyedOrder::default());
        let later = order.enter(Some("edge-01".into()), None, 7).unwrap();
        later.turn().await;
        let earlier = order.enter(Some("edge-01".into()), None, 5).unwrap();
        assert!(!ready(&earlier), "not while the later one runs");
        later.attempt_done();
        assert!(ready(&earlier), "the later one is parked: the earlier goes first");
        assert!(!ready(&later));
        earlier.turn().await;
        drop(earlier);
        assert!(ready(&later));
    }

    #[tokio::test]
    async fn a_turn_is_given_when_the_one_before_leaves() {
        let order = Arc::new(KeyedOrder::default());
        let first = order.enter(Some("k".into()), None, 1).unwrap();
        let second = order.enter(Some("k".into()), None, 2).unwrap();
        first.turn().await;
        let waiting = tokio::spawn(async move {
            second.turn().await;
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(2), waiting).await.unwrap().unwrap();
    }

    /// Waits for `ticket`'s turn in a task of its own; the task ends once the turn is given.
    fn waiting(ticket: Ticket) -> tokio::task::JoinHandle<Ticket> {
        tokio::spawn(async move {
            ticket.turn().await;
            ticket
        })
    }

    async fn given(turn: tokio::task::JoinHandle<Ticket>, what: &str) -> Ticket {
        tokio::time::timeout(std::time::Duration::from_secs(2), turn).await.expect(what).unwrap()
    }

    async fn not_given(turn: &tokio::task::JoinHandle<Ticket>, what: &str) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!turn.is_finished(), "{what}");
    }

    /// Each change wakes only whom it may let start: these are the turns that must still come.
    #[tokio::test]
    async fn every_change_that_lets_a_message_start_wakes_it() {
        let order = Arc::new(KeyedOrder::default());
        let fleet = Some("fleet");
        // A barrier waits for the last message before it to leave.
        let a = order.enter(Some("a".into()), fleet, 1).unwrap();
        let b = order.enter(Some("b".into()), fleet, 2).unwrap();
        a.turn().await;
        b.turn().await;
        let f = waiting(order.enter(Some("fleet".into()), fleet, 3).unwrap());
        drop(a);
        not_given(&f, "b still runs").await;
        b.attempt_done();
        not_given(&f, "b is parked, still before the barrier").await;
        drop(b);
        let f = given(f, "the barrier, once everything before it left").await;
        // Messages after a barrier, of any key, start once it has left.
        let c = waiting(order.enter(Some("c".into()), fleet, 4).unwrap());
        let d = waiting(order.enter(Some("d".into()), fleet, 5).unwrap());
        not_given(&c, "the barrier is still there").await;
        // A message stored before the barrier and delivered again starts when the barrier stops
        // its attempt (parked), not only when it leaves.
        let early = waiting(order.enter(Some("e".into()), fleet, 2).unwrap());
        not_given(&early, "the barrier runs").await;
        f.attempt_done();
        let early = given(early, "a message before a parked barrier").await;
        not_given(&d, "the parked barrier is still before d").await;
        drop(f);
        let (c, d) = (given(c, "c after the barrier left").await, given(d, "d after the barrier left").await);
        // The next of a key starts when the one before it stops its attempt or leaves.
        let c2 = waiting(order.enter(Some("c".into()), fleet, 6).unwrap());
        not_given(&c2, "c runs").await;
        drop(c);
        given(c2, "c's next once c left").await;
        drop((d, early));
    }
}
