//! Read, apply, compare-and-set, retry: [`Kv::update_with`], the one way a key is changed
//! from what it holds, with one retry policy for every caller.

use std::time::Duration;

use super::error::BusError;
use super::kv::{Cas, Kv};

/// How many times [`Kv::update_with`] reads and tries to write before it gives up. Each
/// conflict means another writer's write went in, so every attempt lost is progress made.
pub const UPDATE_ATTEMPTS: u32 = 64;

/// What an update's closure decides, given the key's current value (see [`Kv::update_with`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update<M, T> {
    /// Write this value (creating the key when it is absent), then return `T`.
    Put(M, T),
    /// Delete the key (nothing to do when it is absent), then return `T`.
    Delete(T),
    /// The value is already as it should be: write nothing, return `T`.
    Keep(T),
    /// The change does not apply to this value: write nothing, return `T` (typically an
    /// error saying why). To the store the same as `Keep`; to a reader, a refusal.
    Abort(T),
}

/// The write an [`Update`] asks for, against the revision read.
#[derive(Debug, PartialEq, Eq)]
enum Write<M> {
    Nothing,
    Create(M),
    Update(M, u64),
    Delete(u64),
}

/// Which write `update` needs when the key was read at `revision` (`None`: absent), and the
/// result to return once it is in.
fn plan<M, T>(revision: Option<u64>, update: Update<M, T>) -> (Write<M>, T) {
    match (update, revision) {
        (Update::Put(value, result), None) => (Write::Create(value), result),
        (Update::Put(value, result), Some(rev)) => (Write::Update(value, rev), result),
        (Update::Delete(result), Some(rev)) => (Write::Delete(rev), result),
        (Update::Delete(result) | Update::Keep(result) | Update::Abort(result), _) => (Write::Nothing, result),
    }
}

/// The pause before attempt `attempt` (1-based): none before the first, then 1 ms doubling
/// to 64 ms, so writers racing for one key spread out instead of colliding again at once.
fn backoff(attempt: u32) -> Duration {
    match attempt {
        0 | 1 => Duration::ZERO,
        n => Duration::from_millis(1 << (n - 2).min(6)),
    }
}

impl Kv {
    /// Changes `key` by what `change` decides from its current value (`None`: absent or
    /// deleted): reads it, applies `change`, and writes with compare-and-set; when someone
    /// else wrote first, reads again and applies `change` again, up to [`UPDATE_ATTEMPTS`]
    /// times with a short backoff. Returns the `T` of the attempt that took effect.
    ///
    /// `change` may run more than once, so it must be pure: it looks only at the value it is
    /// given (and what it captured) and does no I/O. Work that must follow the write (publish
    /// an event, settle an outbox) goes after the call, driven by the `T` it returns.
    ///
    /// A hand-written loop such as
    ///
    /// ```ignore
    /// for _ in 0..CAS_ATTEMPTS {
    ///     let Some((mut r, rev)) = sagas.get::<pb::Rollout>(&key).await? else { return Ok(()) };
    ///     if already_done(&r) {
    ///         return Ok(());
    ///     }
    ///     mark(&mut r);
    ///     if let Cas::Written(_) = sagas.update(&key, &r, rev).await? {
    ///         return Ok(());
    ///     }
    /// }
    /// Err(kept_changing())
    /// ```
    ///
    /// becomes
    ///
    /// ```ignore
    /// sagas
    ///     .update_with(&key, |r: Option<&pb::Rollout>| match r {
    ///         Some(r) if !already_done(r) => Update::Put(marked(r), ()),
    ///         _ => Update::Keep(()),
    ///     })
    ///     .await?;
    /// ```
    ///
    /// and a refusal found in the value is an `Abort` carrying the caller's error, with
    /// `T = Result<_, HandlerError>` and a `.await??` at the call. When the caller needs the
    /// entry's revision afterwards (to write it again), use [`Kv::update_with_revision`]; the
    /// record too (to publish its outbox), [`Kv::update_with_entry`].
    ///
    /// # Errors
    /// The value does not decode as `M` ([`BusError::KvDecode`]), the store fails
    /// ([`BusError::Kv`]), or the key kept changing for every attempt
    /// ([`BusError::KeptChanging`], transient).
    pub async fn update_with<M, T>(
        &self,
        key: &str,
        change: impl FnMut(Option<&M>) -> Update<M, T>,
    ) -> Result<T, BusError>
    where
        M: prost::Message + Default,
    {
        Ok(self.update_with_revision(key, change).await?.0)
    }

    /// Creates `key` holding `value` unless it holds something already: whether this call
    /// created it, and the entry as it stands (the value written, or the one found).
    ///
    /// # Errors
    /// As [`Kv::update_with`].
    pub async fn create_or_get<M>(&self, key: &str, value: &M) -> Result<(bool, (M, u64)), BusError>
    where
        M: prost::Message + Default + Clone,
    {
        let (created, entry) = self
            .update_with_entry(key, |current: Option<&M>| match current {
                None => Update::Put(value.clone(), true),
                Some(_) => Update::Keep(false),
            })
            .await?;
        match entry {
            Some(entry) => Ok((created, entry)),
            None => unreachable!("a key just created or found holds a value"),
        }
    }

    /// [`Kv::update_with`], also returning the entry's revision once done: the new one after a
    /// `Put`, `None` after a `Delete`, and the one read after `Keep` or `Abort` (`None` when the
    /// key is absent).
    ///
    /// # Errors
    /// As [`Kv::update_with`].
    pub async fn update_with_revision<M, T>(
        &self,
        key: &str,
        change: impl FnMut(Option<&M>) -> Update<M, T>,
    ) -> Result<(T, Option<u64>), BusError>
    where
        M: prost::Message + Default,
    {
        let (result, entry) = self.update_with_entry(key, change).await?;
        Ok((result, entry.map(|(_, rev)| rev)))
    }

    /// [`Kv::update_with`], also returning the entry as it stands once done, with its revision:
    /// the value written after a `Put`, the value read after `Keep` or `Abort`, `None` after a
    /// `Delete` or when the key is absent. For a caller that goes on with the record (publish
    /// its outbox, write it again) without reading it once more.
    ///
    /// # Errors
    /// As [`Kv::update_with`].
    pub async fn update_with_entry<M, T>(
        &self,
        key: &str,
        mut change: impl FnMut(Option<&M>) -> Update<M, T>,
    ) -> Result<(T, Option<(M, u64)>), BusError>
    where
        M: prost::Message + Default,
    {
        for attempt in 1..=UPDATE_ATTEMPTS {
            // Not even a zero sleep before the first: the timer would round it up to its next tick.
            if attempt > 1 {
                tokio::time::sleep(backoff(attempt)).await;
            }
            let current = self.get::<M>(key).await?;
            let read = current.as_ref().map(|(_, rev)| *rev);
            let (write, result) = plan(read, change(current.as_ref().map(|(value, _)| value)));
            let written = match write {
                Write::Nothing => return Ok((result, current)),
                Write::Create(value) => written(self.create(key, &value).await?, value),
                Write::Update(value, rev) => written(self.update(key, &value, rev).await?, value),
                Write::Delete(rev) => match self.delete_if(key, rev).await? {
                    Cas::Written(_) => return Ok((result, None)),
                    Cas::Conflict => None,
                },
            };
            if let Some(entry) = written {
                return Ok((result, Some(entry)));
            }
        }
        Err(BusError::KeptChanging {
            bucket: self.bucket().to_string(),
            key: key.to_string(),
            attempts: UPDATE_ATTEMPTS,
        })
    }
}

/// `value` with its new revision, when the write went in.
fn written<M>(cas: Cas, value: M) -> Option<(M, u64)> {
    match cas {
        Cas::Written(rev) => Some((value, rev)),
        Cas::Conflict => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_creates_an_absent_key_and_updates_a_present_one_at_its_revision() {
        assert_eq!(plan(None, Update::Put("v", 1)), (Write::Create("v"), 1));
        assert_eq!(plan(Some(7), Update::Put("v", 1)), (Write::Update("v", 7), 1));
    }

    #[test]
    fn a_delete_of_an_absent_key_writes_nothing() {
        assert_eq!(plan::<&str, _>(Some(7), Update::Delete(1)), (Write::Delete(7), 1));
        assert_eq!(plan::<&str, _>(None, Update::Delete(1)), (Write::Nothing, 1));
    }

    #[test]
    fn keep_and_abort_write_nothing_and_return_their_result() {
        for revision in [None, Some(7)] {
            assert_eq!(plan::<&str, _>(revision, Update::Keep("kept")), (Write::Nothing, "kept"));
            assert_eq!(plan::<&str, _>(revision, Update::Abort("refused")), (Write::Nothing, "refused"));
        }
    }

    #[test]
    fn the_backoff_starts_at_once_grows_and_stays_short() {
        assert_eq!(backoff(1), Duration::ZERO);
        assert_eq!(backoff(2), Duration::from_millis(1));
        assert_eq!(backoff(3), Duration::from_millis(2));
        assert_eq!(backoff(UPDATE_ATTEMPTS), Duration::from_millis(64));
        let total: Duration = (1..=UPDATE_ATTEMPTS).map(backoff).sum();
        assert!(total < Duration::from_secs(5), "every attempt within a handler's patience: {total:?}");
    }
}
