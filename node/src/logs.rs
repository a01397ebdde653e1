//! Container logs as the CRI writes them, one line per chunk:
//! `<RFC 3339 time> <stdout|stderr> <F|P> <content>` (`P` marks a partial
//! line continued by the next), and how `kubectl logs` options select
//! from them: `tailLines`, `sinceSeconds`/`sinceTime`, `timestamps`,
//! `limitBytes`. Following a growing file is the server's job; this
//! module turns bytes into what the client sees.

use chrono::{DateTime, Utc};

/// One CRI log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine<'a> {
    /// When the runtime wrote it, as written.
    pub time: &'a str,
    /// "stdout" or "stderr".
    pub stream: &'a str,
    /// The line is cut and continues in the next one.
    pub partial: bool,
    /// What the container wrote, without the newline.
    pub content: &'a str,
}

/// Parses one line of a CRI log file (without its trailing newline).
pub fn parse_line(line: &str) -> Option<LogLine<'_>> {
    let mut parts = line.splitn(4, ' ');
    let time = parts.next()?;
    let stream = parts.next()?;
    let tag = parts.next()?;
    let content = parts.next().unwrap_or("");
    if !matches!(stream, "stdout" | "stderr") {
        return None;
    }
    let partial = tag.split(':').next() == Some("P");
    Some(LogLine { time, stream, partial, content })
}

/// Which lines a `kubectl logs` request wants, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep the stream open and send what the container writes next.
    pub follow: bool,
    /// Only the last N lines.
    pub tail_lines: Option<usize>,
    /// Only lines written at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Prefix each line with the time the runtime wrote it.
    pub timestamps: bool,
    /// Stop after this many bytes.
    pub limit_bytes: Option<usize>,
    /// The previous instance of the container rather than the current one.
    pub previous: bool,
}

/// Renders a line as the client sees it, or `None` when `since` excludes it.
pub fn render(line: &LogLine<'_>, options: &LogOptions) -> Option<String> {
    if let Some(since) = options.since {
        let at = DateTime::parse_from_rfc3339(line.time).ok()?.with_timezone(&Utc);
        if at < since {
            return None;
        }
    }
    let mut out = String::with_capacity(line.content.len() + 40);
    if options.timestamps {
        out.push_str(line.time);
        out.push(' ');
    }
    out.push_str(line.content);
    if !line.partial {
        out.push('\n');
    }
    Some(out)
}

/// What a whole file's text gives under `options` (without following).
/// Partial lines count with the line they complete for `tailLines`.
pub fn select(text: &str, options: &LogOptions) -> String {
    let lines: Vec<LogLine<'_>> = text.lines().filter_map(parse_line).collect();
    let start = match options.tail_lines {
        Some(n) => {
            // Count whole lines from the end: a line ends at a non-partial chunk.
            let mut whole = 0;
            let mut start = lines.len();
            for (i, line) in lines.iter().enumerate().rev() {
                if !line.partial {
                    if whole == n {
                        break;
                    }
                    whole += 1;
                }
                start = i;
            }
            start
        }
        None => 0,
    };
    let mut out = String::new();
    for line in &lines[start..] {
        if let Some(rendered) = render(line, options) {
            out.push_str(&rendered);
        }
    }
    if let Some(limit) = options.limit_bytes {
        let mut cut = limit.min(out.len());
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "2026-12-02T10:00:00.000000001Z stdout F one\n\
        2026-12-02T10:00:01.000000001Z stderr F two\n\
        2026-12-02T10:00:02.000000001Z stdout P thr\n\
        2026-12-02T10:00:02.000000002Z stdout F ee\n\
        2026-12-02T10:00:03.000000001Z stdout F four\n";

    #[test]
    fn cri_lines_parse_into_time_stream_tag_and_content() {
        let line = parse_line("2026-12-02T10:00:00Z stdout F hello world").expect("parses");
        assert_eq!((line.stream, line.partial, line.content), ("stdout", false, "hello world"));
        assert!(parse_line("2026-12-02T10:00:00Z stderr P cut").expect("parses").partial);
        assert_eq!(parse_line("2026-12-02T10:00:00Z stdout F").expect("parses").content, "");
        assert_eq!(parse_line("garbage"), None);
        assert_eq!(parse_line("t nowhere F x"), None);
    }

    #[test]
    fn the_whole_file_joins_partial_lines() {
        assert_eq!(select(FILE, &LogOptions::default()), "one\ntwo\nthree\nfour\n");
    }

    #[test]
    fn tail_lines_counts_whole_lines() {
        let tail = |n| select(FILE, &LogOptions { tail_lines: Some(n), ..Default::default() });
        assert_eq!(tail(1), "four\n");
        assert_eq!(tail(2), "three\nfour\n");
        assert_eq!(tail(0), "");
        assert_eq!(tail(10), "one\ntwo\nthree\nfour\n");
    }

    #[test]
    fn since_timestamps_and_limit_bytes_apply() {
        let since = DateTime::parse_from_rfc3339("2026-12-02T10:00:02Z").expect("time").with_timezone(&Utc);
        let options = LogOptions { since: Some(since), timestamps: true, ..Default::default() };
        assert_eq!(
            select(FILE, &options),
            "2026-12-02T10:00:02.000000001Z thr2026-12-02T10:00:02.000000002Z ee\n2026-12-02T10:00:03.000000001Z four\n"
        );
        assert_eq!(select(FILE, &LogOptions { limit_bytes: Some(6), ..Default::default() }), "one\ntw");
    }
}
