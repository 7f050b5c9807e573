//! The store URL: which backend, and where.

use std::path::PathBuf;

use crate::exit::CliError;

/// What a store URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// `sqlite://PATH` or `sqlite:PATH`: a database file.
    Sqlite(PathBuf),
    /// `redis://`, `rediss://`, `redis+unix://`, `unix://`.
    Redis(String),
    /// `postgres://` or `postgresql://`.
    Postgres(String),
}

const FORMS: &str = "use sqlite://PATH, redis://[:PASSWORD@]HOST[:PORT][/DB] \
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
        let Some((scheme, _)) = lower.split_once("://") else {
            return Err(CliError::usage(format!(
                "{:?} is not a store URL: {FORMS}",
                redacted(url)
            )));
        };
        match scheme {
            "redis" | "rediss" | "redis+unix" | "unix" => Ok(Target::Redis(url.to_owned())),
            "postgres" | "postgresql" => Ok(Target::Postgres(url.to_owned())),
            other => Err(CliError::usage(format!(
                "unsupported URL scheme `{other}`: {FORMS}"
            ))),
        }
    }

    /// The URL to show in messages: never the password.
    pub(crate) fn display(&self) -> String {
        match self {
            Target::Sqlite(path) => format!("sqlite:{}", path.display()),
            Target::Redis(url) | Target::Postgres(url) => redacted(url),
        }
    }
}

/// `url` with the password of its user info replaced by `***`.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    match authority[..at].split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
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
        let err = Target::parse("mysql://u:s3cret@h/db").unwrap_err();
        assert!(!err.to_string().contains("s3cret"));
    }
}
