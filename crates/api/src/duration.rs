//! Go durations (`1500ms`, `1h30m`) read without panicking. kube's parser multiplies each part
//! into a `std::time::Duration` as a float and panics on a part, or a sum, past what one holds
//! (about 584 billion years): `kubectl gpuqueue --request-timeout 99999999999999999999h` went
//! down with it, and so would the operator's watch on a queue stored under a CRD without its
//! CEL rules. Every duration gpuqueue reads from a person goes through [`parse`].

use std::fmt;
use std::time::Duration as StdDuration;

use kube::core::Duration;
use serde::{Deserialize, Deserializer, de};

/// The longest duration read, in seconds (about 31,700 years): beyond any field's own limit,
/// and far below where kube's parser panics.
const LONGEST_SECONDS: f64 = 1e12;

/// Why a duration was not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurationError(String);

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DurationError {}

/// Parses a Go duration as kube does, refusing one longer than about 31,700 years.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    check(text)?;
    text.parse::<Duration>()
        .map_err(|error| DurationError(format!("{text:?} is not a duration: {error}")))
}

/// Whether `text` is a Go duration kube's parser reads without panicking: an optional leading
/// sign, then `0` or parts of a finite number and a known unit, adding up to at most
/// [`LONGEST_SECONDS`]. kube's parser takes each part as it comes, so anything it would
/// multiply before finding a fault later in the text is refused here first.
fn check(text: &str) -> Result<(), DurationError> {
    let not_a_duration = |why: &str| DurationError(format!("{text:?} is not a duration: {why}"));
    let body = text.strip_prefix(['+', '-']).unwrap_or(text);
    if body == "0" {
        return Ok(());
    }
    if body.is_empty() {
        return Err(not_a_duration("it is empty"));
    }
    let is_number = |c: char| c.is_ascii_digit() || c == '.';
    let mut rest = body;
    let mut total = 0.0;
    while !rest.is_empty() {
        let unit_start = rest
            .find(|c: char| !is_number(c))
            .ok_or_else(|| not_a_duration("a number without a unit"))?;
        let (number, after) = rest.split_at(unit_start);
        let unit_end = after.find(is_number).unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let value: f64 = number
            .parse()
            .map_err(|_| not_a_duration(&format!("{number:?} is not a number")))?;
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(not_a_duration(&format!("unknown unit {unit:?}"))),
        };
        total += value * scale;
        if !total.is_finite() || total > LONGEST_SECONDS {
            return Err(DurationError(format!(
                "{text:?} is too long a duration (at most {LONGEST_SECONDS:e} seconds)"
            )));
        }
        rest = next;
    }
    Ok(())
}

/// For `#[serde(deserialize_with)]`: a duration field read through [`parse`].
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse(&text).map_err(de::Error::custom)
}

/// [`deserialize`] for an optional field.
pub fn deserialize_option<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| parse(&text).map_err(de::Error::custom))
        .transpose()
}

/// A Go duration in a file of gpuqueue's own (the simulator's scenarios), read through
/// [`parse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize(deserializer).map(Self)
    }
}

impl GoDuration {
    /// Whether it is below zero (`-5s`).
    pub fn is_negative(self) -> bool {
        self.0.is_negative()
    }
}

impl From<StdDuration> for GoDuration {
    fn from(duration: StdDuration) -> Self {
        Self(duration.into())
    }
}

impl From<GoDuration> for StdDuration {
    fn from(duration: GoDuration) -> Self {
        duration.0.into()
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_reads_as_kube_reads_it_and_an_absurd_one_is_refused_not_a_panic() {
        assert_eq!(
            StdDuration::from(parse("1h30m500ms").unwrap()),
            StdDuration::from_millis(5_400_500)
        );
        assert!(parse("-5s").unwrap().is_negative());
        for absurd in [
            "99999999999999999999h",
            "1e300s",
            "9999999999999s",
            "5000000000000000h1s",
            "-99999999999999999999h",
            // Review findings: a sign inside, and a number too long to be finite.
            "1s-5s",
            &format!("99999999999999999999h{}", "9".repeat(400)),
            "5h1x",
            "1.2.3s",
        ] {
            let error = parse(absurd).unwrap_err().to_string();
            assert!(
                error.contains("too long") || error.contains("not a duration"),
                "{absurd}: {error}"
            );
        }
        assert!(
            parse("lots")
                .unwrap_err()
                .to_string()
                .contains("not a duration")
        );
        for kube_reads in [
            "0",
            "-0s",
            "+3s",
            "1.5h",
            ".5s",
            "2\u{b5}s",
            "2\u{3bc}s",
            "1h2m3s4ms5us6ns",
        ] {
            let kube: Duration = kube_reads.parse().unwrap();
            assert_eq!(parse(kube_reads).unwrap(), kube, "{kube_reads}");
        }
    }

    #[test]
    fn a_field_read_through_it_refuses_what_would_panic() {
        #[derive(Deserialize)]
        struct Field {
            #[serde(deserialize_with = "deserialize")]
            d: Duration,
        }
        let read = |text: &str| serde_json::from_value::<Field>(serde_json::json!({"d": text}));
        assert_eq!(
            StdDuration::from(read("3s").unwrap().d),
            StdDuration::from_secs(3)
        );
        assert!(read("99999999999999999999h").is_err());
    }
}
