//! The store URL: which backend, and where.

use std::path::PathBuf;

use crate::exit::CliError;

/// What a store URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// `sqlite://PATH` or `sqlite:PATH`: a database file.
    Sqlite(PathBuf),
    /// `redis://`, `rediss://`, `redis+unix://`, `unix://`; a Redis Cluster's
    /// `redis+cluster://`, `rediss+cluster://`.
    Redis(String),
    /// `postgres://` or `postgresql://`.
    Postgres(String),
}

const FORMS: &str = "use sqlite://PATH, redis://[:PASSWORD@]HOST[:PORT][/DB], \
                     redis+cluster://HOST:PORT[,HOST:PORT...] \
                     or postgres://USER[:PASSWORD]@HOST[:PORT]/DB";

impl Target {
    pub(crate) fn parse(url: &str) -> Result<Target, CliError> {
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("sqlite:") {
            let path = url
                .get("sqlite://".len()..)
                .filter(|_| lower.starts_with("sqlite://"))
                .unwrap_or(&url["sqlite:".len()..]);
            return match path {
                "" => Err(CliError::usage(format!(
                    "{url:?} names no database file: {FORMS}"
                ))),
                ":memory:" => Err(CliError::usage(
                    "an in-memory SQLite database lives only inside one process: name a file",
                )),
                path => Ok(Target::Sqlite(PathBuf::from(path))),
            };
        }
        // Only a scheme's own characters are quoted back: text before a
        // `://` that is not a scheme may be the user info of a malformed URL.
        let scheme = lower
            .split_once("://")
            .map(|(scheme, _)| scheme)
            .filter(|scheme| {
                scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            });
        let Some(scheme) = scheme else {
            return Err(CliError::usage(format!(
                "{:?} is not a store URL: {FORMS}",
                redacted(url)
            )));
        };
        // A password where a client reads a host, a port or a database
        // name would be quoted back: such a URL is refused unread.
        babel_idem::store::check_url_credentials(url).map_err(|why| {
            CliError::usage(format!(
                "{:?} is not a usable store URL: {why}",
                redacted(url)
            ))
        })?;
        match scheme {
            "redis" | "rediss" | "redis+unix" | "unix" | "redis+cluster" | "rediss+cluster" => {
                Ok(Target::Redis(url.to_owned()))
            }
            "postgres" | "postgresql" => Ok(Target::Postgres(url.to_owned())),
            other => Err(CliError::usage(format!(
                "unsupported URL scheme `{other}`: {FORMS}"
            ))),
        }
    }

    /// The URL to show in messages: never the password.
    pub(crate) fn display(&self) -> String {
        match self {
            // A path may hold what a malformed URL meant as user info.
            Target::Sqlite(path) => redacted(&format!("sqlite:{}", path.display())),
            Target::Redis(url) | Target::Postgres(url) => redacted(url),
        }
    }
}

/// `text` with every secret `url` may carry replaced by `***`, whatever
/// the URL's shape (the library's
/// [`redact_url_secrets`](babel_idem::store::redact_url_secrets)).
pub(crate) fn scrubbed(text: &str, url: &str) -> String {
    babel_idem::store::redact_url_secrets(text, url)
}

/// `url` with every secret it may carry replaced by `***`.
pub(crate) fn redacted(url: &str) -> String {
    scrubbed(url, url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::Exit;

    #[test]
    fn sqlite_urls_name_a_path() {
        let path = |url| match Target::parse(url) {
            Ok(Target::Sqlite(path)) => path,
            other => panic!("{url}: {other:?}"),
        };
        assert_eq!(path("sqlite:///tmp/a.db"), PathBuf::from("/tmp/a.db"));
        assert_eq!(path("sqlite://a.db"), PathBuf::from("a.db"));
        assert_eq!(path("sqlite:a.db"), PathBuf::from("a.db"));
        assert_eq!(path("sqlite:/tmp/a.db"), PathBuf::from("/tmp/a.db"));
    }

    #[test]
    fn servers_and_refusals() {
        assert!(matches!(Target::parse("redis://h/0"), Ok(Target::Redis(_))));
        assert!(matches!(
            Target::parse("redis+cluster://a:7000,b:7000/"),
            Ok(Target::Redis(_))
        ));
        assert!(matches!(
            Target::parse("postgresql://h/db"),
            Ok(Target::Postgres(_))
        ));
        for bad in ["mysql://h/db", "seen.db", "sqlite://", "sqlite::memory:"] {
            assert_eq!(Target::parse(bad).unwrap_err().exit, Exit::Usage, "{bad}");
        }
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redacted("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(redacted("redis://:s3cret@h/0"), "redis://:***@h/0");
        assert_eq!(redacted("redis://h/0?x=a@b"), "redis://h/0?x=a@b");
        assert_eq!(redacted("rediss://:s3cret@h:6380"), "rediss://:***@h:6380");
        assert_eq!(
            redacted("postgres://h/db?sslmode=disable&PassWord=s3cret&user=app"),
            "postgres://h/db?sslmode=disable&PassWord=***&user=app"
        );
        assert_eq!(
            redacted("postgres://h/db?pass%77ord=s3cret"),
            "postgres://h/db?pass%77ord=***"
        );
        let err = Target::parse("mysql://u:s3cret@h/db").unwrap_err();
        assert!(!err.to_string().contains("s3cret"));
        for malformed in [
            "postgres:/u:s3cret@host/db",
            "postgres//u:s3cret@host/db",
            "redis:/:s3cret@host",
            "postgres:///u:s3cret?@host",
            "u:s3cret@h://x",
        ] {
            let err = Target::parse(malformed).unwrap_err();
            assert_eq!(err.exit, Exit::Usage, "{malformed}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        assert_eq!(
            Target::Sqlite(PathBuf::from("u:s3cret@h/db")).display(),
            "sqlite:***@h/db"
        );
    }
}
