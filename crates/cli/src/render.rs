//! Text helpers shared by the inspecting commands: kubectl-style aligned tables, kubectl's
//! short ages, and JSON or YAML for scripts.

use std::io::Write;

use jiff::Timestamp;
use serde::Serialize;

use crate::args::Output;
use crate::connect::InspectError;

/// Columns separated by three spaces and padded to the widest cell, as `kubectl get` prints
/// them; no trailing spaces. Every line ends with a newline.
pub fn table<S: AsRef<str>>(header: &[&str], rows: &[Vec<S>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let width = cell.as_ref().chars().count();
            match widths.get_mut(i) {
                Some(w) => *w = (*w).max(width),
                None => widths.push(width),
            }
        }
    }
    let mut text = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                out.push_str("   ");
            }
            out.push_str(cell);
            let pad = widths[i].saturating_sub(cell.chars().count());
            out.extend(std::iter::repeat_n(' ', pad));
        }
        text.push_str(out.trim_end());
        text.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(AsRef::as_ref));
    }
    text
}

/// How long ago `then` was, the way kubectl prints ages: `45s`, `3m12s`, `25m`, `5h3m`, `20h`,
/// `2d4h`, `40d`. A time in the future (clock skew) reads `0s`.
pub fn age(then: Timestamp, now: Timestamp) -> String {
    let seconds = now.duration_since(then).as_secs().max(0);
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86_400);
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        with_rest(minutes, "m", seconds % 60, "s")
    } else if hours < 3 {
        format!("{minutes}m")
    } else if hours < 8 {
        with_rest(hours, "h", minutes % 60, "m")
    } else if hours < 48 {
        format!("{hours}h")
    } else if days < 8 {
        with_rest(days, "d", hours % 24, "h")
    } else {
        format!("{days}d")
    }
}

/// `5h3m`, or `5h` when the rest is zero.
fn with_rest(whole: i64, unit: &str, rest: i64, rest_unit: &str) -> String {
    if rest == 0 {
        format!("{whole}{unit}")
    } else {
        format!("{whole}{unit}{rest}{rest_unit}")
    }
}

/// Writes `value` as JSON or YAML; `None` for [`Output::Text`], which the command renders.
pub fn structured<T: Serialize>(
    value: &T,
    output: Output,
    out: &mut dyn Write,
) -> Result<bool, InspectError> {
    match output {
        Output::Text => return Ok(false),
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, value)
                .map_err(|e| InspectError::Encode(e.to_string()))?;
            writeln!(out)?;
        }
        Output::Yaml => {
            let text =
                serde_yaml::to_string(value).map_err(|e| InspectError::Encode(e.to_string()))?;
            out.write_all(text.as_bytes())?;
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    #[test]
    fn tables_align_columns_without_trailing_spaces() {
        let rows = vec![
            vec!["online", "24", ""],
            vec!["batch-long-name", "8", "rc-1 Completed"],
        ];
        assert_eq!(
            table(&["QUEUE", "GUARANTEED", "LAST"], &rows),
            "QUEUE             GUARANTEED   LAST\n\
             online            24\n\
             batch-long-name   8            rc-1 Completed\n"
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now: Timestamp = "2026-01-10T12:00:00Z".parse().unwrap();
        let cases = [
            (0, "0s"),
            (45, "45s"),
            (119, "119s"),
            (120, "2m"),
            (192, "3m12s"),
            (5 * 3600, "5h"),
            (25 * 60, "25m"),
            (5 * 3600 + 3 * 60, "5h3m"),
            (20 * 3600, "20h"),
            (2 * 86_400 + 4 * 3600, "2d4h"),
            (40 * 86_400, "40d"),
            (-30, "0s"),
        ];
        for (ago, expected) in cases {
            let then = now - jiff::SignedDuration::from_secs(ago);
            assert_eq!(age(then, now), expected, "{ago}s ago");
        }
    }
}
