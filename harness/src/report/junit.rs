//! The one JUnit XML writer (conform, soak, lab, scenario, e2e check).
//! Hand-written: the format we emit is four elements, and `quick-junit`
//! would bring chrono, uuid, indexmap and quick-xml into a lean tree.

use std::fmt::Write as _;
use std::time::Duration;

/// How one test case ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Pass,
    /// `message` is one line (the attribute); `body` the full text.
    Failure {
        message: String,
        body: String,
    },
    Skipped {
        message: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub name: String,
    pub classname: Option<String>,
    pub time: Option<Duration>,
    pub outcome: Outcome,
    /// Shown as `<system-out>` (e.g. a warning on a passing case).
    pub system_out: Option<String>,
}

impl Case {
    pub fn new(name: impl Into<String>, outcome: Outcome) -> Case {
        Case {
            name: name.into(),
            classname: None,
            time: None,
            outcome,
            system_out: None,
        }
    }

    pub fn pass(name: impl Into<String>) -> Case {
        Case::new(name, Outcome::Pass)
    }

    pub fn failure(
        name: impl Into<String>,
        message: impl Into<String>,
        body: impl Into<String>,
    ) -> Case {
        Case::new(
            name,
            Outcome::Failure {
                message: message.into(),
                body: body.into(),
            },
        )
    }

    pub fn classname(mut self, c: impl Into<String>) -> Case {
        self.classname = Some(c.into());
        self
    }

    pub fn time(mut self, t: Duration) -> Case {
        self.time = Some(t);
        self
    }

    pub fn system_out(mut self, text: impl Into<String>) -> Case {
        self.system_out = Some(text.into());
        self
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Suite {
    pub name: String,
    pub time: Option<Duration>,
    pub cases: Vec<Case>,
}

impl Suite {
    pub fn new(name: impl Into<String>) -> Suite {
        Suite {
            name: name.into(),
            time: None,
            cases: Vec::new(),
        }
    }

    fn count(&self) -> (usize, usize, usize) {
        let failures = self
            .cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failure { .. }))
            .count();
        let skipped = self
            .cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Skipped { .. }))
            .count();
        (self.cases.len(), failures, skipped)
    }
}

/// A `<testsuites>` document.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub name: String,
    pub time: Option<Duration>,
    pub suites: Vec<Suite>,
}

fn time_attr(t: Option<Duration>) -> String {
    t.map(|t| format!(" time=\"{:.3}\"", t.as_secs_f64()))
        .unwrap_or_default()
}

/// `<testsuites …>` or `<testsuite …>` with its counts.
fn open_suite(
    out: &mut String,
    tag: &str,
    name: &str,
    (tests, failures, skipped): (usize, usize, usize),
    time: Option<Duration>,
) {
    let _ = writeln!(
        out,
        "{tag} name=\"{}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\"{}>",
        escape(name),
        time_attr(time)
    );
}

impl Report {
    pub fn new(name: impl Into<String>) -> Report {
        Report {
            name: name.into(),
            time: None,
            suites: Vec::new(),
        }
    }

    pub fn to_xml(&self) -> String {
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let (tests, failures, skipped) = self
            .suites
            .iter()
            .map(Suite::count)
            .fold((0, 0, 0), |(a, b, c), (x, y, z)| (a + x, b + y, c + z));
        open_suite(
            &mut out,
            "<testsuites",
            &self.name,
            (tests, failures, skipped),
            self.time,
        );
        for s in &self.suites {
            open_suite(&mut out, "  <testsuite", &s.name, s.count(), s.time);
            for c in &s.cases {
                let _ = write!(out, "    <testcase name=\"{}\"", escape(&c.name));
                if let Some(class) = &c.classname {
                    let _ = write!(out, " classname=\"{}\"", escape(class));
                }
                out.push_str(&time_attr(c.time));
                if c.outcome == Outcome::Pass && c.system_out.is_none() {
                    out.push_str("/>\n");
                    continue;
                }
                out.push_str(">\n");
                match &c.outcome {
                    Outcome::Pass => {}
                    Outcome::Failure { message, body } => {
                        let _ = writeln!(
                            out,
                            "      <failure message=\"{}\">{}</failure>",
                            escape(message),
                            escape(body)
                        );
                    }
                    Outcome::Skipped { message } => {
                        let _ = writeln!(out, "      <skipped message=\"{}\"/>", escape(message));
                    }
                }
                if let Some(text) = &c.system_out {
                    let _ = writeln!(out, "      <system-out>{}</system-out>", escape(text));
                }
                out.push_str("    </testcase>\n");
            }
            out.push_str("  </testsuite>\n");
        }
        out.push_str("</testsuites>\n");
        out
    }
}

/// Escapes text for XML (and HTML) attributes and content; control
/// characters (which XML 1.0 cannot carry, and which would steer a terminal
/// showing the file) are shown escaped through [`super::human`].
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push(c),
            c => out.push_str(&super::human(c.encode_utf8(&mut [0; 4]))),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_markup_and_show_control_chars() {
        assert_eq!(
            escape("a<b>&\"'\u{1}\n\u{1b}"),
            "a&lt;b&gt;&amp;&quot;&apos;\\u{1}\n\\u{1b}"
        );
    }

    #[test]
    fn counts_and_elements() {
        let mut r = Report::new("cnilab x");
        let mut s = Suite::new("s<1>");
        s.cases
            .push(Case::pass("ok").time(Duration::from_millis(1500)));
        s.cases
            .push(Case::failure("bad", "it & broke", "line1\nline2"));
        s.cases.push(Case::new(
            "skip",
            Outcome::Skipped {
                message: "no ipv6".into(),
            },
        ));
        s.cases.push(Case::pass("warned").system_out("WARN: dns"));
        r.suites.push(s);
        let xml = r.to_xml();
        assert!(xml.contains("<testsuites name=\"cnilab x\" tests=\"4\" failures=\"1\" errors=\"0\" skipped=\"1\">"), "{xml}");
        assert!(
            xml.contains("<testsuite name=\"s&lt;1&gt;\" tests=\"4\""),
            "{xml}"
        );
        assert!(
            xml.contains("<testcase name=\"ok\" time=\"1.500\"/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<failure message=\"it &amp; broke\">line1\nline2</failure>"),
            "{xml}"
        );
        assert!(xml.contains("<skipped message=\"no ipv6\"/>"), "{xml}");
        assert!(xml.contains("<system-out>WARN: dns</system-out>"), "{xml}");
        assert!(xml.ends_with("</testsuites>\n"));
    }
}
