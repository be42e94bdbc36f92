//! Maintenance windows: when changes may start at a site.
//!
//! A window is a cron expression read on the wall clock of an IANA time zone, and a duration.
//! Each minute the expression gives starts an opening of the window, which lasts the duration in
//! real elapsed time: `0 22 * * *` in `Europe/Berlin` for `4h` is open from 22:00 to 02:00 Berlin
//! time every night, and still open at 01:00 for the opening that started the evening before.
//!
//! The cron expression has the five standard fields, `minute hour day-of-month month
//! day-of-week`, each `*`, a value, a range `a-b`, a step `*/n` or `a-b/n`, or a list of these
//! (`1,15,30-40/5`). Months may be named `JAN`–`DEC` and days `SUN`–`SAT`, in any case; day of
//! week 0 and 7 are both Sunday. As in cron, when both day fields are restricted (neither
//! starts with `*`) a day matches when either does: `0 0 13 * FRI` is every 13th and every
//! Friday.
//!
//! Around a change of the zone's offset:
//! - a start the wall clock skips (02:30 when clocks go from 02:00 to 03:00) starts at the first
//!   instant after the gap, 03:00;
//! - a start the wall clock passes twice (02:30 when clocks go back from 03:00 to 02:00) starts
//!   at the first of the two.
//!
//! The time zone database is the one compiled into this crate ([`jiff`]'s bundled copy), so a
//! window is read the same on every machine. Evaluation steps field by field (a month, a day or
//! an hour that cannot match is skipped whole), so it is cheap enough to run for every site on
//! every tick.
//!
//! All instants are milliseconds since the Unix epoch.

use std::fmt;
use std::sync::LazyLock;

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone, TimeZoneDatabase};
use serde::Deserialize;

use crate::domain::InvalidField;

/// The shortest window: one minute.
pub const MIN_DURATION_SECONDS: u32 = 60;
/// The longest window: seven days.
pub const MAX_DURATION_SECONDS: u32 = 7 * 24 * 3600;

/// How far [`Window::next_opening`] looks ahead, in years of the zone's calendar. An expression
/// that can match at all does within this: the rarest are a fixed date on a fixed weekday
/// (`0 0 29 2 */7`, the 29th of February that is a Sunday: 28 years apart, 40 across 2100).
const SEARCH_YEARS: i16 = 50;

/// The time zone database compiled in, not the machine's.
static ZONES: LazyLock<TimeZoneDatabase> = LazyLock::new(TimeZoneDatabase::bundled);

/// A maintenance window as people write it, in the flat site file and in design documents:
/// `{ cron: "0 22 * * *", timeZone: Europe/Berlin, duration: 4h }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WindowSpec {
    /// When an opening starts: five cron fields, on the zone's wall clock.
    pub cron: String,
    /// The IANA time zone the expression is read in, e.g. `Europe/Berlin`.
    pub time_zone: String,
    /// How long each opening lasts, e.g. `4h`, `90m`, `1h30m` (see [`parse_duration`]).
    pub duration: String,
}

impl WindowSpec {
    /// The window it describes; the first problem otherwise.
    ///
    /// # Errors
    /// As [`Window::parse`].
    pub fn window(&self) -> Result<Window, InvalidField> {
        Window::parse(&self.cron, &self.time_zone, &self.duration)
    }

    /// Every problem of the window, each naming its field (`cron`, `timeZone`, `duration`):
    /// what [`Window::parse`] refuses, and a cron expression that never matches a day
    /// ([`Window::opens_ever`]).
    pub fn problems(&self) -> Vec<InvalidField> {
        let mut problems = Vec::new();
        match Cron::parse(&self.cron) {
            Ok(cron) if !cron.can_match() => problems.push(never_opens(&self.cron)),
            Ok(_) => {}
            Err(e) => problems.push(e),
        }
        problems.extend(zone(&self.time_zone).err());
        problems.extend(parse_duration(&self.duration).and_then(|s| check_duration(s, &self.duration)).err());
        problems
    }
}

/// A maintenance window, checked and ready to evaluate.
///
/// Two windows are equal when they are written alike: the same cron text (blanks between the
/// fields aside), the same zone and the same duration.
#[derive(Clone, Deserialize)]
#[serde(try_from = "WindowSpec")]
pub struct Window {
    cron: Cron,
    /// The expression as written, its fields separated by one space.
    text: String,
    zone: TimeZone,
    /// The zone's IANA name, as the database spells it.
    zone_name: String,
    duration_seconds: u32,
}

impl Window {
    /// A window from its cron expression, time zone name and duration (`2h`, `90m`, `1h30m`,
    /// `45s`: see [`parse_duration`]).
    ///
    /// # Errors
    /// The first problem found, its field `cron`, `timeZone` or `duration`: a cron expression
    /// that is not five valid fields (`field "hour" value 25 is out of 0-23`), a zone the IANA
    /// database does not have, a duration that does not read or is under a minute or over
    /// seven days. A cron expression that never matches a day (`0 0 30 2 *`) is a window that
    /// never opens, not an error here: see [`Window::opens_ever`].
    pub fn parse(cron: &str, time_zone: &str, duration: &str) -> Result<Window, InvalidField> {
        let parsed = Cron::parse(cron)?;
        let zone = zone(time_zone)?;
        let seconds = parse_duration(duration).and_then(|s| check_duration(s, duration))?;
        Ok(Self::build(cron, parsed, zone, seconds))
    }

    /// A window whose duration is given in seconds, as the protobuf message carries it.
    ///
    /// # Errors
    /// As [`Window::parse`].
    pub fn from_seconds(cron: &str, time_zone: &str, duration_seconds: u32) -> Result<Window, InvalidField> {
        let parsed = Cron::parse(cron)?;
        let zone = zone(time_zone)?;
        check_duration(duration_seconds, &format!("{duration_seconds}s"))?;
        Ok(Self::build(cron, parsed, zone, duration_seconds))
    }

    fn build(text: &str, cron: Cron, (zone, zone_name): (TimeZone, String), duration_seconds: u32) -> Window {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        Window { cron, text, zone, zone_name, duration_seconds }
    }

    /// The cron expression, its fields separated by one space.
    pub fn cron(&self) -> &str {
        &self.text
    }

    /// The time zone's IANA name.
    pub fn time_zone(&self) -> &str {
        &self.zone_name
    }

    /// How long each opening lasts.
    pub fn duration_seconds(&self) -> u32 {
        self.duration_seconds
    }

    /// The window as written: cron, zone and duration (`4h`, `1h30m`).
    pub fn spec(&self) -> WindowSpec {
        WindowSpec {
            cron: self.text.clone(),
            time_zone: self.zone_name.clone(),
            duration: format_duration(self.duration_seconds),
        }
    }

    /// Whether the cron expression matches any day at all: `0 0 30 2 *` (the 30th of February)
    /// never does. A design refuses a window that never opens.
    pub fn opens_ever(&self) -> bool {
        self.cron.can_match()
    }

    /// Refuses a window that never opens ([`Window::opens_ever`]).
    ///
    /// # Errors
    /// The cron expression never matches a day (field `cron`).
    pub fn check_opens(&self) -> Result<(), InvalidField> {
        if self.opens_ever() { Ok(()) } else { Err(never_opens(&self.text)) }
    }

    /// Whether changes may start at `at_ms`: it lies within `[start, start + duration)` of some
    /// start the expression gives.
    pub fn open_at(&self, at_ms: i64) -> bool {
        // The opening that matters is the first to start after `at` less the duration: open
        // when that one has started by `at`. Starts come in order, so nothing earlier counts.
        let since = at_ms.saturating_sub(i64::from(self.duration_seconds) * 1000);
        let (Some(from), Some(to)) = (self.civil_at(since), self.civil_at(at_ms)) else { return false };
        // A start at or before `at` has a wall-clock time before `at`'s, but for the hour the
        // clock passes twice: looking two days past it is plenty.
        self.starts(from, to.next_day().next_day()).find(|&start| start > since).is_some_and(|start| start <= at_ms)
    }

    /// The first start strictly after `after_ms` (inside an opening: the next one, not the
    /// current). `None` when the expression never matches, or not within 50 years.
    pub fn next_opening(&self, after_ms: i64) -> Option<i64> {
        if !self.opens_ever() {
            return None;
        }
        let from = self.civil_at(after_ms)?;
        self.starts(from, from.years_later(SEARCH_YEARS)).find(|&start| start > after_ms)
    }

    /// `at_ms` on the zone's wall clock, e.g. `2024-06-03 22:00 CEST`.
    pub fn wall_clock(&self, at_ms: i64) -> String {
        match Timestamp::from_millisecond(at_ms) {
            Ok(ts) => ts.to_zoned(self.zone.clone()).strftime("%Y-%m-%d %H:%M %Z").to_string(),
            Err(_) => format!("{at_ms} ms"),
        }
    }

    /// The starts of openings whose wall-clock minute lies from `from` to `until`, in order
    /// (never decreasing: a skipped start and the one after the gap may coincide).
    fn starts(&self, from: Civil, until: Civil) -> impl Iterator<Item = i64> + '_ {
        let mut next = Some(from);
        std::iter::from_fn(move || {
            let minute = self.cron.next_match(next?, until)?;
            next = Some(minute.next_minute());
            self.start_of(minute)
        })
    }

    /// When the opening at wall-clock `minute` starts: a minute the clock skips at the end of
    /// the gap, one it passes twice the first time.
    fn start_of(&self, minute: Civil) -> Option<i64> {
        let dt = DateTime::new(
            minute.year,
            minute.month as i8,
            minute.day as i8,
            minute.hour as i8,
            minute.minute as i8,
            0,
            0,
        )
        .ok()?;
        let start = match self.zone.to_ambiguous_timestamp(dt).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(dt).ok()?,
            AmbiguousOffset::Fold { before, .. } => before.to_timestamp(dt).ok()?,
            AmbiguousOffset::Gap { after, .. } => {
                // Read with the later offset the minute falls before the gap; the transition
                // that follows is where the clock lands after it.
                let before_gap = after.to_timestamp(dt).ok()?;
                self.zone.following(before_gap).next()?.timestamp()
            }
        };
        Some(start.as_millisecond())
    }

    /// The wall-clock minute of `at_ms` in the window's zone.
    fn civil_at(&self, at_ms: i64) -> Option<Civil> {
        let dt = self.zone.to_datetime(Timestamp::from_millisecond(at_ms).ok()?);
        Some(Civil {
            year: dt.year(),
            month: dt.month() as u8,
            day: dt.day() as u8,
            hour: dt.hour() as u8,
            minute: dt.minute() as u8,
        })
    }
}

impl PartialEq for Window {
    fn eq(&self, other: &Self) -> bool {
        (&self.text, &self.zone_name, self.duration_seconds) == (&other.text, &other.zone_name, other.duration_seconds)
    }
}

impl Eq for Window {}

impl fmt::Debug for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("cron", &self.text)
            .field("time_zone", &self.zone_name)
            .field("duration_seconds", &self.duration_seconds)
            .finish()
    }
}

/// `"0 22 * * *" in Europe/Berlin for 4h`.
impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.spec().fmt(f)
    }
}

/// `"0 22 * * *" in Europe/Berlin for 4h`, as written.
impl fmt::Display for WindowSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} in {} for {}", self.cron, self.time_zone, self.duration)
    }
}

impl TryFrom<WindowSpec> for Window {
    type Error = InvalidField;

    fn try_from(spec: WindowSpec) -> Result<Self, InvalidField> {
        spec.window()
    }
}

/// Whether changes may start at `at_ms` under `windows`: inside one of them, or at any time when
/// there are none.
pub fn open_now(windows: &[Window], at_ms: i64) -> bool {
    windows.is_empty() || windows.iter().any(|w| w.open_at(at_ms))
}

/// The first start of any of `windows` strictly after `after_ms`; `None` when none opens again
/// (and for no windows at all, which are always open).
pub fn next_opening(windows: &[Window], after_ms: i64) -> Option<i64> {
    windows.iter().filter_map(|w| w.next_opening(after_ms)).min()
}

/// Reads a duration: whole numbers each with a unit, `d`, `h`, `m` or `s`, the largest first and
/// each once: `2h`, `90m`, `1h30m`, `45s`, `1d12h`. Returns seconds.
///
/// # Errors
/// Text that is not such a duration (field `duration`).
pub fn parse_duration(text: &str) -> Result<u32, InvalidField> {
    let refuse = |why: &str| InvalidField::new("duration", format!("{text:?} {why} (e.g. 2h, 90m, 1h30m)"));
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(refuse("is not a duration"));
    }
    let mut seconds: u64 = 0;
    let mut last_unit: Option<usize> = None;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let number: u64 = rest[..digits].parse().map_err(|_| refuse("is not a duration"))?;
        let Some(unit) = rest[digits..].chars().next() else {
            return Err(refuse("needs a unit after each number: d, h, m or s"));
        };
        let Some(index) = "dhms".find(unit) else {
            let why = format!("has {unit:?} where a unit belongs: d, h, m or s (e.g. {number}h)");
            return Err(InvalidField::new("duration", format!("{text:?} {why}")));
        };
        if last_unit.is_some_and(|last| index <= last) {
            return Err(refuse("must give each unit once, the largest first"));
        }
        last_unit = Some(index);
        let per_unit = [86_400, 3_600, 60, 1][index];
        seconds = seconds.saturating_add(number.saturating_mul(per_unit));
        rest = &rest[digits + unit.len_utf8()..];
    }
    Ok(u32::try_from(seconds).unwrap_or(u32::MAX))
}

/// `seconds` as [`parse_duration`] reads it: `4h`, `1h30m`, `1d12h`, `0s`.
pub fn format_duration(seconds: u32) -> String {
    let mut out = String::new();
    let mut rest = seconds;
    for (unit, per_unit) in [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)] {
        if rest >= per_unit {
            out.push_str(&format!("{}{unit}", rest / per_unit));
            rest %= per_unit;
        }
    }
    if out.is_empty() { "0s".to_string() } else { out }
}

/// `at_ms` in UTC, to the minute: `2024-06-03 20:00 UTC`.
pub fn format_utc(at_ms: i64) -> String {
    match Timestamp::from_millisecond(at_ms) {
        Ok(ts) => ts.strftime("%Y-%m-%d %H:%M UTC").to_string(),
        Err(_) => format!("{at_ms} ms"),
    }
}

/// An instant written in RFC 3339 with its offset (`2024-06-03T20:00:00Z`), in milliseconds.
///
/// # Errors
/// Text that is not such an instant (field `time`).
pub fn parse_instant(text: &str) -> Result<i64, InvalidField> {
    text.trim().parse::<Timestamp>().map(Timestamp::as_millisecond).map_err(|e| {
        InvalidField::new("time", format!("{text:?} is not an instant such as 2024-06-03T20:00:00Z ({e})"))
    })
}

/// A duration's bounds; `written` is how the duration was given, for the error.
fn check_duration(seconds: u32, written: &str) -> Result<u32, InvalidField> {
    if seconds < MIN_DURATION_SECONDS {
        return Err(InvalidField::new("duration", format!("{written} is shorter than a window may be (1m)")));
    }
    if seconds > MAX_DURATION_SECONDS {
        return Err(InvalidField::new("duration", format!("{written} is longer than a window may be (7d)")));
    }
    Ok(seconds)
}

/// The zone named `name` in the compiled-in database, and its name as the database spells it.
fn zone(name: &str) -> Result<(TimeZone, String), InvalidField> {
    let unknown = || {
        InvalidField::new(
            "timeZone",
            format!("{name:?} is not an IANA time zone (e.g. Europe/Berlin, America/Los_Angeles, UTC)"),
        )
    };
    let zone = ZONES.get(name).map_err(|_| unknown())?;
    if zone.is_unknown() {
        return Err(unknown());
    }
    let canonical = zone.iana_name().unwrap_or(name).to_string();
    Ok((zone, canonical))
}

/// Why a window whose expression never matches a day is refused.
fn never_opens(cron: &str) -> InvalidField {
    InvalidField::new(
        "cron",
        format!(
            "{cron:?} never matches a day (none of its months has its day of the month), so the window never opens"
        ),
    )
}

/// A wall-clock minute. Ordered as time goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Civil {
    year: i16,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
}

impl Civil {
    fn day_start(year: i16, month: u8, day: u8) -> Civil {
        Civil { year, month, day, hour: 0, minute: 0 }
    }

    fn next_day(self) -> Civil {
        if self.day < days_in_month(self.year, self.month) {
            Civil::day_start(self.year, self.month, self.day + 1)
        } else if self.month < 12 {
            Civil::day_start(self.year, self.month + 1, 1)
        } else {
            Civil::day_start(self.year.saturating_add(1), 1, 1)
        }
    }

    fn next_hour(self) -> Civil {
        if self.hour < 23 { Civil { hour: self.hour + 1, minute: 0, ..self } } else { self.next_day() }
    }

    fn next_minute(self) -> Civil {
        if self.minute < 59 { Civil { minute: self.minute + 1, ..self } } else { self.next_hour() }
    }

    /// The same wall-clock minute `years` later (only compared with, never read as a date).
    fn years_later(self, years: i16) -> Civil {
        Civil { year: self.year.saturating_add(years), ..self }
    }
}

fn is_leap(year: i16) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i16, month: u8) -> u8 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The day of the week, Sunday 0, of a proleptic Gregorian date.
fn weekday(year: i16, month: u8, day: u8) -> u8 {
    // Days since 1970-01-01 (a Thursday), counting years from March so that the leap day ends
    // the year.
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((i64::from(month) + 9) % 12) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    (days + 4).rem_euclid(7) as u8
}

/// One field of the cron expression: its name, its values and the names it takes.
struct Field {
    name: &'static str,
    min: u8,
    max: u8,
    /// Names of the values from `min` on, matched in any case.
    names: &'static [&'static str],
    /// How names are described in errors.
    named: &'static str,
}

const FIELDS: [Field; 5] = [
    Field { name: "minute", min: 0, max: 59, names: &[], named: "" },
    Field { name: "hour", min: 0, max: 23, names: &[], named: "" },
    Field { name: "day-of-month", min: 1, max: 31, names: &[], named: "" },
    Field {
        name: "month",
        min: 1,
        max: 12,
        names: &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
        named: " or a month name (JAN-DEC)",
    },
    Field {
        name: "day-of-week",
        min: 0,
        max: 7,
        names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
        named: " or a day name (SUN-SAT)",
    },
];

impl Field {
    /// The values `text` selects, as bits, or why it is refused.
    fn parse(&self, text: &str) -> Result<u64, String> {
        let mut bits = 0u64;
        for item in text.split(',') {
            if item.is_empty() {
                return Err(format!("{text:?} has an empty item"));
            }
            let (range, step) = match item.split_once('/') {
                Some((range, step)) => (range, Some(self.step(step)?)),
                None => (item, None),
            };
            let (low, high) = if range == "*" {
                (self.min, self.max)
            } else if let Some((low, high)) = range.split_once('-') {
                (self.value(low)?, self.value(high)?)
            } else if step.is_some() {
                return Err(format!("{item:?} steps from a single value: write */n or a range a-b/n"));
            } else {
                let value = self.value(range)?;
                (value, value)
            };
            if low > high {
                return Err(format!("range {range:?} runs backwards: write it from low to high"));
            }
            for value in (low..=high).step_by(usize::from(step.unwrap_or(1))) {
                bits |= 1 << value;
            }
        }
        Ok(bits)
    }

    fn value(&self, text: &str) -> Result<u8, String> {
        if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit()) {
            return match text.parse::<u32>() {
                Ok(v) if (u32::from(self.min)..=u32::from(self.max)).contains(&v) => Ok(v as u8),
                _ => Err(format!("value {text} is out of {}-{}", self.min, self.max)),
            };
        }
        self.names
            .iter()
            .position(|name| name.eq_ignore_ascii_case(text))
            .map(|i| self.min + i as u8)
            .ok_or_else(|| format!("value {text:?} is not a number{}", self.named))
    }

    fn step(&self, text: &str) -> Result<u8, String> {
        match text.parse::<u8>() {
            Ok(step) if (1..=self.max).contains(&step) && text.chars().all(|c| c.is_ascii_digit()) => Ok(step),
            _ => Err(format!("step {text:?} is not a whole number from 1 to {}", self.max)),
        }
    }
}

/// A parsed cron expression: the values of each field as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cron {
    minutes: u64,
    hours: u64,
    /// Bits 1 to 31.
    days: u64,
    /// Bits 1 to 12.
    months: u64,
    /// Bits 0 (Sunday) to 6.
    weekdays: u64,
    /// Both day fields are restricted (neither starts with `*`): a day matches when either does.
    either_day: bool,
}

impl Cron {
    fn parse(text: &str) -> Result<Cron, InvalidField> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        if fields.len() != FIELDS.len() {
            return Err(InvalidField::new(
                "cron",
                format!(
                    "{text:?} has {} fields; a cron expression has 5: minute hour day-of-month month day-of-week",
                    fields.len()
                ),
            ));
        }
        let mut bits = [0u64; 5];
        for ((field, text), bits) in FIELDS.iter().zip(&fields).zip(&mut bits) {
            *bits = field
                .parse(text)
                .map_err(|reason| InvalidField::new("cron", format!("field {:?} {reason}", field.name)))?;
        }
        let [minutes, hours, days, months, weekdays] = bits;
        // 7 is Sunday too.
        let weekdays = (weekdays | weekdays >> 7) & 0x7f;
        let either_day = !fields[2].starts_with('*') && !fields[4].starts_with('*');
        Ok(Cron { minutes, hours, days, months, weekdays, either_day })
    }

    fn day_matches(&self, year: i16, month: u8, day: u8) -> bool {
        let by_date = self.days >> day & 1 == 1;
        let by_weekday = self.weekdays >> weekday(year, month, day) & 1 == 1;
        if self.either_day { by_date || by_weekday } else { by_date && by_weekday }
    }

    /// Whether some day matches: a weekday does in every month, and otherwise one of the days of
    /// the month must exist in one of the months (the 29th of February counts). Every weekday
    /// falls on every possible date some year.
    fn can_match(&self) -> bool {
        self.either_day
            || (1..=12u8).any(|month| {
                self.months >> month & 1 == 1 && (1..=days_in_month(2000, month)).any(|day| self.days >> day & 1 == 1)
            })
    }

    /// The first matching minute from `at` on, up to `until`.
    fn next_match(&self, mut at: Civil, until: Civil) -> Option<Civil> {
        while at <= until {
            if self.months >> at.month & 1 == 0 {
                at = match next_bit(self.months, at.month + 1, 12) {
                    Some(month) => Civil::day_start(at.year, month, 1),
                    None => Civil::day_start(at.year.checked_add(1)?, next_bit(self.months, 1, 12)?, 1),
                };
                continue;
            }
            if !self.day_matches(at.year, at.month, at.day) {
                at = at.next_day();
                continue;
            }
            let Some(hour) = next_bit(self.hours, at.hour, 23) else {
                at = at.next_day();
                continue;
            };
            if hour != at.hour {
                at = Civil { hour, minute: 0, ..at };
            }
            let Some(minute) = next_bit(self.minutes, at.minute, 59) else {
                at = at.next_hour();
                continue;
            };
            let found = Civil { minute, ..at };
            return (found <= until).then_some(found);
        }
        None
    }
}

/// The lowest set bit of `bits` from `from` to `max`.
fn next_bit(bits: u64, from: u8, max: u8) -> Option<u8> {
    if from > max {
        return None;
    }
    let rest = bits >> from;
    if rest == 0 {
        return None;
    }
    let bit = from + rest.trailing_zeros() as u8;
    (bit <= max).then_some(bit)
}

#[cfg(test)]
mod tests;
