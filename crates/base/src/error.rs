//! An error and its sources as one line: what a log line, a 502 body or a CLI message shows
//! (`client error (Connect): tcp connect error: Connection refused`), written once.

/// Joins an error and its sources with `": "`, skipping a source whose text the line already
/// holds (hyper and std errors often repeat their cause in their own message).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn sources_join_once_each() {
        let refused = Layer("Connection refused", None);
        let connect = Layer("tcp connect error", Some(Box::new(refused)));
        let top = Layer("client error (Connect)", Some(Box::new(connect)));
        assert_eq!(
            error_chain(&top),
            "client error (Connect): tcp connect error: Connection refused"
        );
        let repeats = Layer(
            "query failed: disk full",
            Some(Box::new(Layer("disk full", None))),
        );
        assert_eq!(error_chain(&repeats), "query failed: disk full");
    }
}
