use super::*;

/// Milliseconds of an RFC 3339 instant.
fn ms(text: &str) -> i64 {
    parse_instant(text).unwrap()
}

/// An instant as RFC 3339 in UTC, or `never`.
fn iso(at: Option<i64>) -> String {
    at.map_or("never".to_string(), |ms| Timestamp::from_millisecond(ms).unwrap().to_string())
}

fn window(cron: &str, zone: &str, duration: &str) -> Window {
    Window::parse(cron, zone, duration).unwrap_or_else(|e| panic!("{cron}: {e}"))
}

fn cron(text: &str) -> Cron {
    Cron::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn bits(values: impl IntoIterator<Item = u8>) -> u64 {
    values.into_iter().fold(0, |bits, v| bits | 1 << v)
}

#[test]
fn every_piece_of_cron_syntax() {
    let c = cron("*/15 9-17 1,15 JAN-mar mon-FRI");
    assert_eq!(c.minutes, bits([0, 15, 30, 45]), "a step over the whole field");
    assert_eq!(c.hours, bits(9..=17), "a range");
    assert_eq!(c.days, bits([1, 15]), "a list");
    assert_eq!(c.months, bits(1..=3), "month names in a range, in any case");
    assert_eq!(c.weekdays, bits(1..=5), "day names in a range, in any case");
    assert!(c.either_day, "both day fields restricted");

    let c = cron("5,10-20/5 */6 * * 0,7");
    assert_eq!(c.minutes, bits([5, 10, 15, 20]), "a value and a stepped range in a list");
    assert_eq!(c.hours, bits([0, 6, 12, 18]));
    assert_eq!(c.days, bits(1..=31));
    assert_eq!(c.months, bits(1..=12));
    assert_eq!(c.weekdays, bits([0]), "0 and 7 are both Sunday");
    assert!(!c.either_day);

    assert_eq!(cron("0 0 * dec sun").months, bits([12]));
    assert_eq!(cron("0 0 * dec sun").weekdays, bits([0]));
    assert_eq!(cron("0 0 * * 5-7").weekdays, bits([0, 5, 6]), "a range up to 7 ends on Sunday");
    assert_eq!(cron("0 0 * * *").weekdays, bits(0..=6));
    assert!(!cron("0 0 */2 * MON").either_day, "a day field starting with * is not restricted");

    // Blanks between the fields are not part of the expression.
    assert_eq!(window("  0   22 * *\t*  ", "UTC", "1h").cron(), "0 22 * * *");
}

#[test]
fn cron_errors_name_the_field_and_the_value() {
    for (text, expected) in [
        ("0 25 * * *", r#"cron: field "hour" value 25 is out of 0-23"#),
        ("60 * * * *", r#"cron: field "minute" value 60 is out of 0-59"#),
        ("0 0 0 * *", r#"cron: field "day-of-month" value 0 is out of 1-31"#),
        ("0 0 * 13 *", r#"cron: field "month" value 13 is out of 1-12"#),
        ("0 0 * * 8", r#"cron: field "day-of-week" value 8 is out of 0-7"#),
        ("0 22 * *", r#"cron: "0 22 * *" has 4 fields; a cron expression has 5"#),
        ("0 22 * * * *", r#"cron: "0 22 * * * *" has 6 fields"#),
        ("", r#"cron: "" has 0 fields"#),
        ("*/0 * * * *", r#"cron: field "minute" step "0" is not a whole number from 1 to 59"#),
        ("*/x * * * *", r#"cron: field "minute" step "x" is not"#),
        ("5/10 * * * *", r#"cron: field "minute" "5/10" steps from a single value"#),
        ("0 20-10 * * *", r#"cron: field "hour" range "20-10" runs backwards"#),
        ("0 0 * * MON-SUN", r#"cron: field "day-of-week" range "MON-SUN" runs backwards"#),
        ("0 0 1,,2 * *", r#"cron: field "day-of-month" "1,,2" has an empty item"#),
        ("0 0 * FOO *", r#"cron: field "month" value "FOO" is not a number or a month name (JAN-DEC)"#),
        ("0 0 * MON *", r#"cron: field "month" value "MON" is not a number or a month name"#),
        ("0 0 * * JAN", r#"cron: field "day-of-week" value "JAN" is not a number or a day name (SUN-SAT)"#),
        ("0 -1 * * *", r#"cron: field "hour" value "" is not a number"#),
        ("@daily", r#"cron: "@daily" has 1 fields"#),
    ] {
        let err = Window::parse(text, "UTC", "1h").expect_err(text).to_string();
        assert!(err.starts_with(expected), "{text}: {err}");
    }
}

#[test]
fn zone_and_duration_errors() {
    for (zone, duration, expected) in [
        ("Mars/Olympus", "1h", r#"timeZone: "Mars/Olympus" is not an IANA time zone"#),
        ("", "1h", r#"timeZone: "" is not an IANA time zone"#),
        ("Etc/Unknown", "1h", r#"timeZone: "Etc/Unknown" is not an IANA time zone"#),
        ("UTC", "45s", "duration: 45s is shorter than a window may be (1m)"),
        ("UTC", "8d", "duration: 8d is longer than a window may be (7d)"),
        ("UTC", "4 hours", r#"duration: "4 hours" has ' ' where a unit belongs: d, h, m or s (e.g. 4h)"#),
        ("UTC", "90", r#"duration: "90" needs a unit after each number"#),
        ("UTC", "30m2h", r#"duration: "30m2h" must give each unit once, the largest first"#),
        ("UTC", "2h2h", r#"duration: "2h2h" must give each unit once"#),
        ("UTC", "", r#"duration: "" is not a duration (e.g. 2h, 90m, 1h30m)"#),
        ("UTC", "h", r#"duration: "h" is not a duration"#),
    ] {
        let err = Window::parse("0 22 * * *", zone, duration).expect_err(duration).to_string();
        assert!(err.starts_with(expected), "{zone} {duration}: {err}");
    }
    // The protobuf's seconds are held to the same bounds.
    assert!(Window::from_seconds("0 22 * * *", "UTC", 59).unwrap_err().to_string().contains("59s is shorter"));
    assert!(Window::from_seconds("0 22 * * *", "UTC", MAX_DURATION_SECONDS + 1).is_err());
    assert_eq!(Window::from_seconds("0 22 * * *", "UTC", 14_400).unwrap(), window("0 22 * * *", "UTC", "4h"));
}

#[test]
fn durations_read_and_written() {
    for (text, seconds) in
        [("2h", 7_200), ("90m", 5_400), ("1h30m", 5_400), ("45s", 45), ("7d", 604_800), ("1d12h", 129_600)]
    {
        assert_eq!(parse_duration(text).unwrap(), seconds, "{text}");
    }
    assert_eq!(format_duration(5_400), "1h30m");
    assert_eq!(format_duration(14_400), "4h");
    assert_eq!(format_duration(90), "1m30s");
    assert_eq!(format_duration(129_600), "1d12h");
}

#[test]
fn every_problem_of_a_written_window_at_once() {
    let spec = WindowSpec { cron: "0 25 * * *".into(), time_zone: "Mars/Olympus".into(), duration: "45s".into() };
    let fields: Vec<String> = spec.problems().iter().map(|p| p.field.clone()).collect();
    assert_eq!(fields, ["cron", "timeZone", "duration"]);
    assert_eq!(spec.window().unwrap_err().field, "cron", "parse stops at the first");

    let never = WindowSpec { cron: "0 0 30 2 *".into(), time_zone: "UTC".into(), duration: "1h".into() };
    let problems = never.problems();
    assert_eq!(problems.len(), 1);
    assert!(problems[0].to_string().starts_with(r#"cron: "0 0 30 2 *" never matches a day"#), "{}", problems[0]);
    let good = WindowSpec { cron: "0 22 * * *".into(), time_zone: "europe/berlin".into(), duration: "240m".into() };
    assert!(good.problems().is_empty());
    let spec = good.window().unwrap().spec();
    assert_eq!(spec.time_zone, "Europe/Berlin", "the zone as the database spells it");
    assert_eq!(spec.duration, "4h");
}

#[test]
fn read_from_yaml_with_its_field_names() {
    let w: Window = crate::yaml::from_str("{ cron: '0 22 * * *', timeZone: Europe/Berlin, duration: 4h }").unwrap();
    assert_eq!(w.to_string(), r#""0 22 * * *" in Europe/Berlin for 4h"#);
    let err = crate::yaml::from_str::<Window>("{ cron: '0 22 * * *', timezone: UTC, duration: 4h }").unwrap_err();
    assert!(err.to_string().contains("unknown field `timezone`"), "{err}");
    let err = crate::yaml::from_str::<Window>("{ cron: '0 25 * * *', timeZone: UTC, duration: 4h }").unwrap_err();
    assert!(err.to_string().contains(r#"cron: field "hour" value 25 is out of 0-23"#), "{err}");
}

#[test]
fn one_instant_in_two_time_zones() {
    // 09:30 in Berlin (CEST), 00:30 in Los Angeles (PDT).
    let at = ms("2024-06-03T07:30:00Z");
    let berlin = window("0 9 * * *", "Europe/Berlin", "1h");
    let los_angeles = window("0 9 * * *", "America/Los_Angeles", "1h");
    assert!(berlin.open_at(at));
    assert!(!los_angeles.open_at(at));
    assert_eq!(iso(berlin.next_opening(at)), "2024-06-04T07:00:00Z");
    assert_eq!(iso(los_angeles.next_opening(at)), "2024-06-03T16:00:00Z");
    assert_eq!(berlin.wall_clock(at), "2024-06-03 09:30 CEST");
    assert_eq!(los_angeles.wall_clock(at), "2024-06-03 00:30 PDT");
    assert_eq!(format_utc(at), "2024-06-03 07:30 UTC");
}

#[test]
fn a_window_across_midnight_is_open_after_it() {
    // 22:00 to 02:00 Berlin time (CET): 21:00 to 01:00 UTC.
    let w = window("0 22 * * *", "Europe/Berlin", "4h");
    assert!(w.open_at(ms("2024-01-09T21:00:00Z")), "from its start");
    assert!(w.open_at(ms("2024-01-10T00:00:00Z")), "01:00 the next day, on the opening of the evening before");
    assert!(w.open_at(ms("2024-01-10T00:59:59.999Z")));
    assert!(!w.open_at(ms("2024-01-10T01:00:00Z")), "closed when the duration is over");
    assert!(!w.open_at(ms("2024-01-10T20:59:59.999Z")));
}

#[test]
fn the_next_opening_from_inside_a_window_is_the_next_start() {
    let w = window("0 22 * * *", "Europe/Berlin", "4h");
    assert_eq!(iso(w.next_opening(ms("2024-01-09T22:00:00Z"))), "2024-01-10T21:00:00Z", "open now: the next one");
    assert_eq!(iso(w.next_opening(ms("2024-01-09T21:00:00Z"))), "2024-01-10T21:00:00Z", "strictly after");
    assert_eq!(iso(w.next_opening(ms("2024-01-09T20:59:59.999Z"))), "2024-01-09T21:00:00Z");
}

#[test]
fn a_start_in_the_spring_gap_starts_when_the_gap_ends() {
    // Berlin, 2024-03-31: at 02:00 CET (01:00 UTC) clocks go to 03:00 CEST; 02:30 never happens.
    let w = window("30 2 * * *", "Europe/Berlin", "1h");
    assert_eq!(iso(w.next_opening(ms("2024-03-30T12:00:00Z"))), "2024-03-31T01:00:00Z", "03:00 CEST");
    assert!(!w.open_at(ms("2024-03-31T00:59:59Z")), "01:59 CET, before the gap");
    assert!(w.open_at(ms("2024-03-31T01:00:00Z")));
    assert!(w.open_at(ms("2024-03-31T01:59:59Z")));
    assert!(!w.open_at(ms("2024-03-31T02:00:00Z")), "an hour of real time");
    assert_eq!(iso(w.next_opening(ms("2024-03-31T01:00:00Z"))), "2024-04-01T00:30:00Z", "02:30 CEST the day after");

    // Three starts in the gap are one opening; the next is the next day's first.
    let w = window("*/20 2 * * *", "Europe/Berlin", "10m");
    assert_eq!(iso(w.next_opening(ms("2024-03-31T00:00:00Z"))), "2024-03-31T01:00:00Z");
    assert_eq!(iso(w.next_opening(ms("2024-03-31T01:00:00Z"))), "2024-04-01T00:00:00Z");
}

#[test]
fn a_start_the_autumn_clock_passes_twice_starts_the_first_time() {
    // Berlin, 2024-10-27: at 03:00 CEST (01:00 UTC) clocks go back to 02:00 CET, so 02:30 is
    // both 00:30 and 01:30 UTC.
    let w = window("30 2 * * *", "Europe/Berlin", "30m");
    assert_eq!(iso(w.next_opening(ms("2024-10-26T12:00:00Z"))), "2024-10-27T00:30:00Z");
    assert!(w.open_at(ms("2024-10-27T00:45:00Z")));
    assert!(!w.open_at(ms("2024-10-27T01:00:00Z")));
    assert!(!w.open_at(ms("2024-10-27T01:45:00Z")), "the second 02:30 starts nothing");
    assert_eq!(iso(w.next_opening(ms("2024-10-27T00:30:00Z"))), "2024-10-28T01:30:00Z", "02:30 CET the day after");
    assert_eq!(iso(w.next_opening(ms("2024-10-27T01:35:00Z"))), "2024-10-28T01:30:00Z", "from the second 02:35");

    // The duration is real time: two hours from 02:00 CEST end at 03:00 CET.
    let w = window("0 2 * * *", "Europe/Berlin", "2h");
    assert!(w.open_at(ms("2024-10-27T01:59:59Z")));
    assert!(!w.open_at(ms("2024-10-27T02:00:00Z")));
}

#[test]
fn with_both_day_fields_restricted_either_matches() {
    // The 13th of each month and every Friday.
    let w = window("0 12 13 * FRI", "UTC", "1h");
    assert!(w.open_at(ms("2024-09-06T12:30:00Z")), "Friday the 6th");
    assert!(w.open_at(ms("2024-10-13T12:30:00Z")), "Sunday the 13th");
    assert!(!w.open_at(ms("2024-10-14T12:30:00Z")), "Monday the 14th");
    assert!(!window("0 12 13 * *", "UTC", "1h").open_at(ms("2024-09-06T12:30:00Z")), "the 13th only");
    assert!(!window("0 12 * * FRI", "UTC", "1h").open_at(ms("2024-10-13T12:30:00Z")), "Fridays only");
    // A day field starting with * restricts nothing on its own: both must match.
    let w = window("0 12 */13 * FRI", "UTC", "1h");
    assert!(!w.open_at(ms("2024-09-06T12:30:00Z")), "a Friday, but not the 1st, 14th or 27th");
    assert_eq!(iso(w.next_opening(ms("2024-09-01T00:00:00Z"))), "2024-09-27T12:00:00Z", "Friday the 27th");
}

#[test]
fn a_window_that_never_opens_and_one_that_rarely_does() {
    let never = window("0 0 30 2 *", "UTC", "1h");
    assert!(!never.opens_ever());
    assert_eq!(never.next_opening(ms("2024-01-01T00:00:00Z")), None);
    assert!(!never.open_at(ms("2024-02-29T00:30:00Z")));
    assert!(!window("0 0 31 4,6,9,11 *", "UTC", "1h").opens_ever());

    let leap = window("0 0 29 2 *", "UTC", "1h");
    assert!(leap.opens_ever());
    assert_eq!(iso(leap.next_opening(ms("2025-01-01T00:00:00Z"))), "2028-02-29T00:00:00Z");
    assert_eq!(iso(leap.next_opening(ms("2097-01-01T00:00:00Z"))), "2104-02-29T00:00:00Z", "2100 is no leap year");
}

#[test]
fn a_list_of_windows() {
    let at = ms("2024-06-03T07:30:00Z");
    let berlin = window("0 9 * * *", "Europe/Berlin", "1h");
    let los_angeles = window("0 9 * * *", "America/Los_Angeles", "1h");
    assert!(open_now(&[], at), "no windows: always open");
    assert_eq!(next_opening(&[], at), None);
    assert!(!open_now(std::slice::from_ref(&los_angeles), at));
    assert!(open_now(&[los_angeles.clone(), berlin.clone()], at));
    assert_eq!(iso(next_opening(&[berlin, los_angeles], at)), "2024-06-03T16:00:00Z", "the earliest of them");
}

#[test]
fn ten_thousand_evaluations_are_quick() {
    let windows = [
        window("0 22 * * *", "Europe/Berlin", "4h"),
        window("*/15 9-17 * * MON-FRI", "America/Los_Angeles", "5m"),
        window("30 2 1,15 * SUN", "Australia/Sydney", "2h"),
        window("0 3 * JAN,JUL 6", "Asia/Kolkata", "7d"),
        window("0 0 29 2 *", "UTC", "1h"),
    ];
    let start = ms("2024-01-01T00:00:00Z");
    let mut open = 0;
    for i in 0..10_000i64 {
        let w = &windows[(i % 5) as usize];
        // Steps of a little over 17 hours: every hour of the day over about 20 years.
        let at = start + i * 61_813_000;
        open += usize::from(w.open_at(at));
        let next = w.next_opening(at).expect("each of these opens again");
        assert!(next > at);
        assert!(w.open_at(next), "open at its own start");
    }
    assert!(open > 100, "{open} open of 10,000");
}
