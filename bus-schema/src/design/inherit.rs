//! Inheritable values: what one layer of a profile chain writes, and how it applies on top of
//! what the layers below it produced.
//!
//! - A scalar is a value, or `'!'` to clear the inherited one ([`ScalarPatch`]).
//! - A named list holds entries, each replacing the inherited entry of the same name, and
//!   `'!name'` strings removing an inherited entry ([`ListPatch`]).
//! - A map holds keys, each replacing the inherited key, and `'!key'` keys removing an inherited
//!   key ([`MapPatch`]).
//!
//! `!` starts a YAML tag, so these markers must be quoted: `role: '!'`, `- '!eno2'`. An
//! unquoted one is refused by the YAML rules ([`crate::yaml`]), which refuse tags: read as a
//! tag, `- !eno2` would otherwise be an empty entry.
//!
//! List entries and map values are read untyped first (as [`serde_json::Value`]), as the YAML
//! rules type them, and then as the entry or as text.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeOwned, Error as _, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::origin::Origin;
use crate::domain::PackageRef;

/// The marker that clears a scalar, and the prefix that removes a list entry or a map key.
pub const CLEAR: &str = "!";

/// A value together with the document that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sourced<T> {
    /// The value.
    pub value: T,
    /// The document whose layer set it.
    pub origin: Origin,
}

impl<T> Sourced<T> {
    /// `value`, set by `origin`.
    pub fn new(value: T, origin: Origin) -> Self {
        Self { value, origin }
    }
}

/// An effective scalar: never set, cleared by a layer, or set by a layer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Setting<T> {
    /// No layer set it.
    #[default]
    Unset,
    /// A layer cleared it with `'!'`.
    Cleared(Origin),
    /// A layer set it.
    Set(Sourced<T>),
}

impl<T> Setting<T> {
    /// The value, if one is set.
    pub fn value(&self) -> Option<&T> {
        match self {
            Setting::Set(s) => Some(&s.value),
            Setting::Unset | Setting::Cleared(_) => None,
        }
    }

    /// The document that set or cleared it.
    pub fn origin(&self) -> Option<&Origin> {
        match self {
            Setting::Set(s) => Some(&s.origin),
            Setting::Cleared(origin) => Some(origin),
            Setting::Unset => None,
        }
    }
}

/// An entry of a named list: merged and removed by its name.
pub trait Named {
    /// The name the entry is merged by.
    fn name(&self) -> &str;
}

impl Named for PackageRef {
    fn name(&self) -> &str {
        self.name.as_str()
    }
}

/// A scalar as one layer writes it: a value, or `'!'` to clear the inherited value.
///
/// Only string-valued scalars are inheritable (names and roles), so a patch is read from a
/// YAML string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScalarPatch<T> {
    /// `'!'`: the inherited value is cleared.
    Clear,
    /// The layer's own value.
    Set(T),
}

impl<T: Clone> ScalarPatch<T> {
    /// Applies this layer, set by `origin`, on top of `current`.
    pub fn apply(&self, current: &mut Setting<T>, origin: &Origin) {
        *current = match self {
            ScalarPatch::Clear => Setting::Cleared(origin.clone()),
            ScalarPatch::Set(value) => Setting::Set(Sourced::new(value.clone(), origin.clone())),
        };
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for ScalarPatch<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor<T>(PhantomData<T>);

        impl<T: DeserializeOwned> Visitor<'_> for ScalarVisitor<T> {
            type Value = ScalarPatch<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, or '!' to clear the inherited value")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                if s == CLEAR {
                    return Ok(ScalarPatch::Clear);
                }
                if s.is_empty() {
                    return Err(E::custom("empty value (to clear the inherited value, write '!' in quotes)"));
                }
                T::deserialize(s.into_deserializer()).map(ScalarPatch::Set)
            }
        }

        deserializer.deserialize_str(ScalarVisitor(PhantomData))
    }
}

/// A named list as one layer writes it: entries that add or replace, names that remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPatch<T> {
    /// Inherited entries to remove (written `'!name'`).
    pub remove: BTreeSet<String>,
    /// Entries to add, each replacing an inherited entry of the same name as a whole.
    pub set: Vec<T>,
}

impl<T> Default for ListPatch<T> {
    fn default() -> Self {
        Self { remove: BTreeSet::new(), set: Vec::new() }
    }
}

impl<T: Named + Clone> ListPatch<T> {
    /// Applies this layer, set by `origin`, on top of `current` (keyed by entry name).
    pub fn apply(&self, current: &mut BTreeMap<String, Sourced<T>>, origin: &Origin) {
        for name in &self.remove {
            current.remove(name);
        }
        for entry in &self.set {
            current.insert(entry.name().to_string(), Sourced::new(entry.clone(), origin.clone()));
        }
    }
}

impl<'de, T: Named + DeserializeOwned> Deserialize<'de> for ListPatch<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor<T>(PhantomData<T>);

        impl<'de, T: Named + DeserializeOwned> Visitor<'de> for ListVisitor<T> {
            type Value = ListPatch<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of entries and '!name' removals")
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(ListPatch::default())
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut patch = ListPatch::default();
                let mut names = BTreeSet::new();
                let mut item = 0;
                while let Some(value) = seq.next_element::<Value>()? {
                    item += 1;
                    let at = |e: String| A::Error::custom(format!("item {item}: {e}"));
                    let entry = list_item::<T>(value).map_err(at)?;
                    let name = match &entry {
                        ListItem::Remove(name) => name.clone(),
                        ListItem::Set(entry) => entry.name().to_string(),
                    };
                    if !names.insert(name.clone()) {
                        return Err(at(format!("{name:?} appears twice in this list")));
                    }
                    match entry {
                        ListItem::Remove(name) => {
                            patch.remove.insert(name);
                        }
                        ListItem::Set(entry) => patch.set.push(entry),
                    }
                }
                Ok(patch)
            }
        }

        deserializer.deserialize_any(ListVisitor(PhantomData))
    }
}

/// One item of a named list as written.
enum ListItem<T> {
    Remove(String),
    Set(T),
}

/// Reads one list item: `'!name'` or an entry.
fn list_item<T: DeserializeOwned>(value: Value) -> Result<ListItem<T>, String> {
    match value {
        Value::String(s) => removal(&s).map(ListItem::Remove),
        other => T::deserialize(other).map(ListItem::Set).map_err(|e| e.to_string()),
    }
}

/// A map as one layer writes it: keys that add or replace, `'!key'` keys that remove.
///
/// Values may be written as strings, numbers or booleans (kept as their text); an empty value
/// (`~`) is the empty string, e.g. a kernel parameter without value such as `nosmt`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapPatch {
    /// Inherited keys to remove (written `'!key'`).
    pub remove: BTreeSet<String>,
    /// Keys to add or replace.
    pub set: BTreeMap<String, String>,
}

impl MapPatch {
    /// Applies this layer, set by `origin`, on top of `current`.
    pub fn apply(&self, current: &mut BTreeMap<String, Sourced<String>>, origin: &Origin) {
        for key in &self.remove {
            current.remove(key);
        }
        for (key, value) in &self.set {
            current.insert(key.clone(), Sourced::new(value.clone(), origin.clone()));
        }
    }
}

impl<'de> Deserialize<'de> for MapPatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;

        impl<'de> Visitor<'de> for MapVisitor {
            type Value = MapPatch;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of keys and '!key' removals")
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(MapPatch::default())
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut patch = MapPatch::default();
                while let Some((key, value)) = map.next_entry::<Value, Value>()? {
                    let key = text(&key).ok_or_else(|| A::Error::custom("a key must be a string"))?;
                    if key.starts_with(CLEAR) {
                        let name = removal(&key).map_err(A::Error::custom)?;
                        patch.remove.insert(name);
                    } else {
                        let value = text(&value)
                            .ok_or_else(|| A::Error::custom(format!("the value of {key:?} must be a scalar")))?;
                        patch.set.insert(key, value);
                    }
                }
                if let Some(both) = patch.remove.iter().find(|k| patch.set.contains_key(*k)) {
                    return Err(A::Error::custom(format!("{both:?} is both set and removed")));
                }
                Ok(patch)
            }
        }

        deserializer.deserialize_any(MapVisitor)
    }
}

/// Reads a map of scalars (strings, numbers, booleans) as text: labels and selectors.
pub(crate) fn text_map<'de, D: Deserializer<'de>>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error> {
    let patch = MapPatch::deserialize(deserializer)?;
    if let Some(key) = patch.remove.first() {
        return Err(D::Error::custom(format!("'!{key}' removes a key, which only inheritable maps do")));
    }
    Ok(patch.set)
}

/// The name a `'!name'` removal names.
fn removal(s: &str) -> Result<String, String> {
    match s.strip_prefix(CLEAR) {
        Some("") => Err("'!' alone cannot name an entry to remove; write '!name'".to_string()),
        Some(name) => Ok(name.to_string()),
        None => Err(format!("{s:?} is not an entry: write a mapping, or '!{s}' to remove an inherited entry")),
    }
}

/// A scalar's text, numbers as YAML writes them (`1.5`, `1e20`); `None` for sequences and maps.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::Null => Some(String::new()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) if n.is_f64() => Some(n.to_string().replace("e+", "e")),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        Value::Array(_) | Value::Object(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::origin::Kind;
    use crate::domain::Role;

    #[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        name: String,
        #[serde(default)]
        size: u32,
    }

    impl Named for Entry {
        fn name(&self) -> &str {
            &self.name
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Layer {
        role: Option<ScalarPatch<Role>>,
        #[serde(default)]
        list: ListPatch<Entry>,
        #[serde(default)]
        map: MapPatch,
    }

    fn layer(yaml: &str) -> Result<Layer, String> {
        crate::yaml::from_str(yaml).map_err(|e| e.to_string())
    }

    fn origin(name: &str) -> Origin {
        Origin { kind: Kind::HostProfile, name: name.to_string(), source: "t.yaml".to_string(), index: 1 }
    }

    #[test]
    fn reads_values_clears_and_removals() {
        let l = layer("role: '!'\nlist: [{ name: a, size: 2 }, '!b']\nmap: { x: 1, y: ~, z: true, '!w': ~ }").unwrap();
        assert_eq!(l.role, Some(ScalarPatch::Clear));
        assert_eq!(l.list.set, [Entry { name: "a".into(), size: 2 }]);
        assert_eq!(l.list.remove, BTreeSet::from(["b".to_string()]));
        assert_eq!(l.map.set["x"], "1");
        assert_eq!(l.map.set["y"], "");
        assert_eq!(l.map.set["z"], "true");
        assert_eq!(l.map.remove, BTreeSet::from(["w".to_string()]));
        assert_eq!(layer("role: worker").unwrap().role, Some(ScalarPatch::Set(Role::Worker)));
    }

    #[test]
    fn refuses_ambiguous_patches_with_the_field_named() {
        for (yaml, expected) in [
            ("role: boss", "role: unknown variant `boss`"),
            ("role: ''", "role: empty value"),
            ("role: !", "role: empty value"),
            ("list: [eno2]", "list: item 1: \"eno2\" is not an entry"),
            ("list: ['!']", "list: item 1: '!' alone"),
            ("list:\n  - !eno2\n", "list: item 1: !eno2 is read as a YAML tag"),
            ("list: [{ name: a }, { name: a }]", "list: item 2: \"a\" appears twice"),
            ("list: [{ name: a }, '!a']", "list: item 2: \"a\" appears twice"),
            ("list: [{ name: a, colour: red }]", "list: item 1: unknown field `colour`"),
            ("map: { x: 1, '!x': ~ }", "map: \"x\" is both set and removed"),
            ("map: { x: [1] }", "map: the value of \"x\" must be a scalar"),
        ] {
            let err = layer(yaml).expect_err(yaml);
            assert!(err.starts_with(expected), "{yaml}: {err}");
        }
    }

    #[test]
    fn applies_on_top_of_what_is_inherited() {
        let base = layer("role: master\nlist: [{ name: a }, { name: b }]\nmap: { x: '1', y: '2' }").unwrap();
        let child =
            layer("role: '!'\nlist: ['!a', { name: b, size: 9 }, { name: c }]\nmap: { '!x': ~, y: '3' }").unwrap();
        let (mut role, mut list, mut map) = (Setting::Unset, BTreeMap::new(), BTreeMap::new());
        for (l, o) in [(&base, origin("base")), (&child, origin("child"))] {
            if let Some(r) = &l.role {
                r.apply(&mut role, &o);
            }
            l.list.apply(&mut list, &o);
            l.map.apply(&mut map, &o);
        }
        assert_eq!(role, Setting::Cleared(origin("child")));
        assert_eq!(list.keys().collect::<Vec<_>>(), ["b", "c"]);
        assert_eq!(list["b"].value.size, 9);
        assert_eq!(list["b"].origin, origin("child"));
        assert_eq!(map.len(), 1);
        assert_eq!(map["y"], Sourced::new("3".to_string(), origin("child")));
    }

    #[test]
    fn text_maps_refuse_removals() {
        #[derive(Debug, Deserialize)]
        struct Labels {
            #[serde(deserialize_with = "text_map")]
            labels: BTreeMap<String, String>,
        }
        let ok: Labels = crate::yaml::from_str("labels: { rack: 1, tier: gold }").unwrap();
        assert_eq!(ok.labels["rack"], "1");
        let err = crate::yaml::from_str::<Labels>("labels: { '!rack': ~ }").unwrap_err().to_string();
        assert!(err.contains("only inheritable maps"), "{err}");
    }
}
