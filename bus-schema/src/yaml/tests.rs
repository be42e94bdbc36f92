//! The YAML reader: core-schema scalars, tags and duplicate keys refused, positions in the whole
//! file, limits on untrusted input.

use serde::Deserialize;
use serde_json::{Value, json};

use super::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Named {
    name: Option<String>,
    #[serde(default)]
    networks: Vec<Network>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Network {
    name: String,
    cidr: String,
}

fn refused<T: DeserializeOwned + fmt::Debug>(text: &str) -> Error {
    from_str::<T>(text).expect_err(text)
}

#[test]
fn an_unquoted_tag_is_refused_where_an_untyped_read_would_drop_it() {
    // The trap: read untyped, a tag's node loses the tag and `!eno2` (a tag on nothing) is null.
    let dropped: Value = serde_saphyr::from_str("- !eno2\n- !foo bar\n").unwrap();
    assert_eq!(dropped, json!([null, "bar"]));

    let e = refused::<Value>("items:\n  - '!eno1'\n  - !eno2\n");
    assert_eq!((e.field.as_str(), e.at), ("items", Some((3, 5))));
    assert!(e.reason.starts_with("item 2: !eno2 is read as a YAML tag"), "{e}");
    assert!(e.reason.contains("write '!eno2' in quotes"), "{e}");
    let e = refused::<Value>("labels: { rack: !r1, '!tier': ~ }\n");
    assert_eq!((e.field.as_str(), e.at), ("labels.rack", Some((1, 17))));
    let e = refused::<Value>("labels: { !rack : r1 }\n");
    assert_eq!((e.field.as_str(), e.at), ("labels", Some((1, 11))));
    // Typed, too: `name: !foo` would be no name at all.
    let e = refused::<Named>("name: !foo\n");
    assert_eq!((e.field.as_str(), e.at), ("name", Some((1, 7))));
    let e = refused::<Named>("networks: !list [{ name: a, cidr: b }]\n");
    assert_eq!(e.field, "networks");

    // Quoted, it is text; the standard tags and the bare `!` keep their meaning.
    let read: Value = from_str("- '!eno2'\n- ! x\n- !!str 12\n- !!int '12'\n").unwrap();
    assert_eq!(read, json!(["!eno2", "x", "12", 12]));
}

#[test]
fn scalars_are_typed_by_the_yaml_core_schema() {
    for (written, read) in [
        ("1", json!(1)),
        ("-1", json!(-1)),
        ("+1", json!(1)),
        ("0x1F", json!(31)),
        ("0o17", json!(15)),
        ("0b101", json!(5)),
        ("18446744073709551615", json!(18446744073709551615u64)),
        ("-9223372036854775808", json!(-9223372036854775808i64)),
        ("1.50", json!(1.5)),
        ("1e3", json!(1000.0)),
        (".5", json!(0.5)),
        ("true", json!(true)),
        ("True", json!(true)),
        ("FALSE", json!(false)),
        ("~", json!(null)),
        ("null", json!(null)),
        ("", json!(null)),
        // Text: YAML 1.1's booleans, leading zeros, underscores, versions, dates.
        ("yes", json!("yes")),
        ("off", json!("off")),
        ("y", json!("y")),
        ("tRue", json!("tRue")),
        ("012", json!("012")),
        ("-012", json!("-012")),
        ("1_000", json!("1_000")),
        ("0x_1F", json!("0x_1F")),
        ("inf", json!("inf")),
        ("1.29.1+k3s1", json!("1.29.1+k3s1")),
        ("2024-01-01", json!("2024-01-01")),
        ("12:30", json!("12:30")),
        ("'1'", json!("1")),
        ("'~'", json!("~")),
    ] {
        let value: Value = from_str(&format!("x: {written}\n")).unwrap_or_else(|e| panic!("{written}: {e}"));
        assert_eq!(value["x"], read, "{written}");
    }
}

#[test]
fn numbers_yaml_readers_disagree_on_are_refused() {
    for (written, why) in [
        ("0X1F", "upper-case radix prefix"),
        ("-0O17", "upper-case radix prefix"),
        ("0B1", "upper-case radix prefix"),
        ("18446744073709551616", "beyond a 64-bit integer"),
        ("-9223372036854775809", "beyond a 64-bit integer"),
        ("0x1FFFFFFFFFFFFFFFF", "beyond a 64-bit integer"),
        (".inf", "non-finite float"),
        ("-.Inf", "non-finite float"),
        (".nan", "non-finite float"),
        ("1e999", "non-finite float"),
    ] {
        let e = refused::<Value>(&format!("a: 1\nb:\n  - 2\n  - {written}\n"));
        assert!(e.reason.contains(why), "{written}: {e}");
        assert_eq!(e.at.map(|(line, _)| line), Some(4), "{written}: {e}");
        assert!(e.field == "b" || e.field == "b[1]", "{written}: {e}");
    }
    let e = refused::<Value>("a: 0X1F\n");
    assert_eq!(
        e.to_string(),
        "a: unquoted 0X1F has an upper-case radix prefix, which not every YAML reader takes for a number: write it in quotes for text (line 1, column 4)"
    );
    // Quoted, each is text.
    let read: Value = from_str("- '0X1F'\n- \"18446744073709551616\"\n- '.inf'\n").unwrap();
    assert_eq!(read, json!(["0X1F", "18446744073709551616", ".inf"]));
}

#[test]
fn errors_name_the_field_line_and_column() {
    let e = refused::<Named>("name: a\nnetworks:\n  - { name: n, cidr: [1] }\n");
    assert_eq!(e.to_string(), "networks[0].cidr: invalid type: sequence, expected a string (line 3, column 22)");
    let e = refused::<Named>("name: a\nnetworks:\n  - name: n\n    cidr:\n      x: 1\n");
    assert_eq!(
        (e.field.as_str(), e.reason.as_str(), e.at),
        ("networks[0].cidr", "invalid type: map, expected a string", Some((5, 7)))
    );
    let e = refused::<Named>("name: a\nnetworks:\n  - name: n\n    cidr:\n      - x\n");
    assert_eq!(
        (e.field.as_str(), e.reason.as_str(), e.at),
        ("networks[0].cidr", "invalid type: sequence, expected a string", Some((5, 7)))
    );
    // An unknown field is the fault of the mapping that holds it.
    let e = refused::<Named>("name: a\nnetworks: [{ name: n, cidr: c, ntwork: x }]\n");
    assert_eq!((e.field.as_str(), e.at), ("networks[0]", Some((2, 32))));
    assert!(e.reason.starts_with("unknown field `ntwork`"), "{e}");
    let e = refused::<Named>("nme: a\n");
    assert_eq!((e.field.as_str(), e.at), ("", Some((1, 1))));
    assert!(e.to_string().starts_with("unknown field `nme`"), "{e}");
    let e = refused::<Named>("name: a\nnetworks: [{ name: n }]\n");
    assert_eq!((e.field.as_str(), e.reason.as_str()), ("networks[0]", "missing field `cidr`"));
}

#[test]
fn keys_given_twice_and_merge_keys_are_refused() {
    let e = refused::<Value>("labels:\n  rack: r1\n  rack: r2\n");
    assert_eq!((e.field.as_str(), e.at), ("labels", Some((3, 3))));
    assert!(e.reason.contains("duplicate mapping key: rack"), "{e}");
    let e = refused::<Value>("base: &base { rack: r1 }\nnode:\n  <<: *base\n  name: n\n");
    assert_eq!(e.at.map(|(line, _)| line), Some(3), "{e}");
    // Anchors and aliases themselves are fine.
    let read: Value = from_str("base: &base { rack: r1 }\nnode: *base\n").unwrap();
    assert_eq!(read["node"], json!({ "rack": "r1" }));
}

#[test]
fn an_alias_bomb_is_refused() {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..9 {
        let below = level - 1;
        text.push_str(&format!("a{level}: &a{level} [*a{below}, *a{below}, *a{below}, *a{below}, *a{below}, *a{below}, *a{below}, *a{below}, *a{below}, *a{below}]\n"));
    }
    let e = refused::<Value>(&text);
    assert!(e.at.is_some(), "{e}");
}

#[test]
fn a_stream_keeps_its_documents_in_order_with_whole_source_positions() {
    let text = "name: a\n---\n---\n# only a comment\n---\nname: b\nnetworks:\n  - { name: n, cidr: [1] }\n";
    let documents = documents(text);
    assert_eq!(documents.len(), 4);
    let names: Vec<Option<String>> = documents
        .iter()
        .map(|d| {
            d.as_ref().unwrap().parse::<Option<Named>>().map(|n| n.and_then(|n| n.name)).unwrap_or(Some("!".into()))
        })
        .collect();
    assert_eq!(names, [Some("a".to_string()), None, None, Some("!".into())]);
    let e = documents[3].as_ref().unwrap().parse::<Named>().unwrap_err();
    assert_eq!((e.field.as_str(), e.at), ("networks[0].cidr", Some((8, 22))));
    assert_eq!(documents[3].as_ref().unwrap().start(), (5, 1));

    // Positions on the line a document starts on, after a document end (`...`) that shares it.
    let documents = super::documents("name: a\n...\n--- { name: [b] }\n");
    let e = documents[1].as_ref().unwrap().parse::<Named>().unwrap_err();
    assert_eq!((e.field.as_str(), e.at), ("name", Some((3, 13))));

    // A tag in a later document is refused with its own line, the document kept apart.
    let documents = super::documents("name: a\n---\nname: b\nnetworks:\n  - !net\n");
    assert!(documents[0].as_ref().unwrap().parse::<Named>().is_ok());
    let e = documents[1].as_ref().unwrap().parse::<Named>().unwrap_err();
    assert_eq!((e.field.as_str(), e.at), ("networks", Some((5, 5))));
    assert!(e.reason.starts_with("item 1: !net is read as a YAML tag"), "{e}");
}

#[test]
fn a_syntax_error_ends_the_stream() {
    let documents = documents("name: a\n---\nname: [b\n---\nname: c\n");
    assert_eq!(documents.len(), 2);
    assert!(documents[0].is_ok());
    let e = documents[1].as_ref().unwrap_err();
    assert_eq!((e.field.as_str(), e.at), ("", Some((3, 7))));
    assert!(super::documents("").is_empty());
}

#[test]
fn from_str_reads_one_document() {
    let e = refused::<Named>("name: a\n---\nname: b\n");
    assert_eq!(e.to_string(), "a second YAML document starts here; one is expected (line 2, column 1)");
    let e = refused::<Named>("name: [a\n");
    assert_eq!(e.at, Some((1, 7)));
    assert!(from_str::<Named>("# nothing\n").unwrap().name.is_none());
}
