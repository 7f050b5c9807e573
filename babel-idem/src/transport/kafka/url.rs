//! `kafka://host:port[,host:port...]` URLs: the family's way of naming a
//! Kafka cluster, turned into librdkafka's `bootstrap.servers`.

use crate::broker::TransportError;

use super::super::binding::check_credentials;

/// The bootstrap servers of a `kafka://` URL, as librdkafka takes them
/// (`host:port,host:port`). A host without a port gets Kafka's 9092; a
/// path, a query or a fragment is refused, as is a URL with a password (a
/// SASL setup goes through the builder's client settings, where it is not
/// echoed in errors).
pub(super) fn bootstrap_servers(url: &str) -> Result<String, TransportError> {
    check_credentials(url)?;
    let Some(rest) = url.strip_prefix("kafka://") else {
        return Err(TransportError::invalid_url(
            url,
            "a Kafka URL starts with kafka://",
        ));
    };
    if rest.contains(['/', '?', '#']) {
        return Err(TransportError::invalid_url(
            url,
            "a Kafka URL names hosts only: kafka://host:port[,host:port]",
        ));
    }
    if rest.contains('@') {
        return Err(TransportError::invalid_url(
            url,
            "credentials go in the client settings, not the URL",
        ));
    }
    let mut servers = Vec::new();
    for host in rest.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(TransportError::invalid_url(url, "an empty host"));
        }
        match host.rsplit_once(':') {
            // `[::1]:9092`, `host:9092`
            Some((name, port)) if !name.is_empty() && !port.contains(']') => {
                if port.parse::<u16>().is_err() {
                    return Err(TransportError::invalid_url(
                        url,
                        format!("{port:?} is not a port"),
                    ));
                }
                servers.push(host.to_owned());
            }
            _ => servers.push(format!("{host}:9092")),
        }
    }
    Ok(servers.join(","))
}

#[cfg(test)]
mod tests {
    use super::bootstrap_servers;

    #[test]
    fn hosts_are_joined_as_bootstrap_servers() {
        assert_eq!(
            bootstrap_servers("kafka://a:9092,b:9093").unwrap(),
            "a:9092,b:9093"
        );
    }

    #[test]
    fn a_host_without_a_port_gets_kafkas_default_port() {
        assert_eq!(bootstrap_servers("kafka://broker").unwrap(), "broker:9092");
        assert_eq!(bootstrap_servers("kafka://[::1]").unwrap(), "[::1]:9092");
        assert_eq!(
            bootstrap_servers("kafka://[::1]:9094").unwrap(),
            "[::1]:9094"
        );
    }

    #[test]
    fn other_schemes_paths_and_bad_ports_are_refused_with_the_reason() {
        for (url, says) in [
            ("redis://a:9092", "starts with kafka://"),
            ("kafka://a:9092/topic", "names hosts only"),
            ("kafka://a:port", "is not a port"),
            ("kafka://a:9092,,b", "an empty host"),
        ] {
            let error = bootstrap_servers(url).unwrap_err().to_string();
            assert!(error.contains(says), "{url}: {error}");
        }
    }

    #[test]
    fn a_password_is_never_echoed() {
        let error = bootstrap_servers("kafka://user:s3cret@a:9092")
            .unwrap_err()
            .to_string();
        assert!(!error.contains("s3cret"), "{error}");
    }
}
