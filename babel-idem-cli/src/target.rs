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
        let Some((scheme, _)) = lower.split_once("://") else {
            return Err(CliError::usage(format!(
                "{:?} is not a store URL: {FORMS}",
                redacted(url)
            )));
        };
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
            Target::Sqlite(path) => format!("sqlite:{}", path.display()),
            Target::Redis(url) | Target::Postgres(url) => redacted(url),
        }
    }
}

/// The secrets `url` carries: the password of its user info
/// (`user:PW@`, Redis's `:PW@`) and the value of every query parameter
/// that names a password (`password=`, `sslpassword=`, in any case).
pub(crate) fn secrets(url: &str) -> Vec<&str> {
    let mut found = Vec::new();
    // Without `://` (a malformed URL, quoted back in its error) the whole
    // text is searched as if it were the authority onwards.
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if let Some(at) = authority.rfind('@')
        && let Some((_, password)) = authority[..at].split_once(':')
    {
        found.push(password);
    }
    if let Some((_, query)) = rest.split_once('?') {
        let query = query.split('#').next().unwrap_or(query);
        for pair in query.split('&') {
            if let Some((key, value)) = pair.split_once('=')
                && names_a_password(key)
            {
                found.push(value);
            }
        }
    }
    found.retain(|secret| !secret.is_empty());
    found
}

/// Whether a query parameter's name (percent-encoded or not) names a
/// password.
fn names_a_password(key: &str) -> bool {
    let decoded = percent_decoded(key).to_ascii_lowercase();
    decoded.contains("password") || matches!(decoded.as_str(), "pass" | "passwd" | "pwd")
}

/// `text` with `%XX` escapes decoded (invalid escapes kept as they are).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` with every secret of `url` replaced by `***`.
pub(crate) fn scrubbed(text: &str, url: &str) -> String {
    let mut secrets = secrets(url);
    // The longest first: a secret inside another is then already gone.
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    let mut text = text.to_owned();
    for secret in secrets {
        text = text.replace(secret, "***");
    }
    text
}

/// `url` with every secret it carries replaced by `***`.
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
    }
}
