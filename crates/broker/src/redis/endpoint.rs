//! Where the data is: a fixed server (`redis://…`), the primary a set of
//! Sentinels names (`redis+sentinel://…`), asked again while the node runs
//! so that a failover is followed, or a Redis Cluster reached through seed
//! nodes (`redis+cluster://…`).

use std::time::Duration;

use ::redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use ::redis::{ConnectionInfo, IntoConnectionInfo};

use super::errors::unavailable;
use crate::ClusterError;

/// The scheme of a Sentinel URL.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// The scheme of a Redis Cluster URL.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// The port of a Sentinel named without one (Redis's default for Sentinels).
const SENTINEL_PORT: u16 = 26379;

/// How the `redis` setting names the primary.
pub(super) enum Source {
    /// `redis://…`: always this server.
    Fixed(ConnectionInfo),
    /// `redis+sentinel://…`: whichever server the Sentinels name.
    Sentinel(Sentinels),
    /// `redis+cluster://…`: a Redis Cluster, found through these seeds.
    Cluster(Vec<ConnectionInfo>),
}

impl Source {
    /// Reads `url`: `redis://[user:password@]host:port[/db]`, or
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/master[/db]`
    /// (the user and password are the data nodes', the Sentinels are reached
    /// without).
    pub(super) fn parse(url: &str) -> Result<Source, ClusterError> {
        if let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) {
            return parse_cluster(rest).map(Source::Cluster);
        }
        let Some(rest) = url.strip_prefix(SENTINEL_SCHEME) else {
            return url
                .into_connection_info()
                .map(Source::Fixed)
                .map_err(unavailable);
        };
        let refuse = |why: &str| {
            ClusterError::Unavailable(format!(
                "{why}: a Sentinel URL is \
                 redis+sentinel://[user:password@]host:port[,host:port...]/master_name[/db]"
            ))
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (user_info, hosts) = match authority.rsplit_once('@') {
            Some((user_info, hosts)) => (Some(user_info), hosts),
            None => (None, authority),
        };
        let path = path.trim_end_matches('/');
        let (master, db) = path.split_once('/').unwrap_or((path, ""));
        if master.is_empty() {
            return Err(refuse("no master name"));
        }
        let db: i64 = match db {
            "" => 0,
            db => db.parse().map_err(|_| refuse("the db is not a number"))?,
        };
        let mut sentinels = Vec::new();
        for host in hosts.split(',').filter(|h| !h.is_empty()) {
            // A port after the last colon, unless that colon is inside an
            // IPv6 address's brackets.
            let with_port = match host.rsplit_once(':') {
                Some((_, port)) if !port.contains(']') => host.to_owned(),
                _ => format!("{host}:{SENTINEL_PORT}"),
            };
            let info = format!("redis://{with_port}/")
                .into_connection_info()
                .map_err(|e| refuse(&format!("Sentinel {host:?}: {e}")))?;
            sentinels.push(info);
        }
        if sentinels.is_empty() {
            return Err(refuse("no Sentinel address"));
        }
        // The redis crate reads (and percent-decodes) the credentials.
        let user_info = user_info.map_or(String::new(), |u| format!("{u}@"));
        let node = format!("redis://{user_info}localhost/{db}")
            .into_connection_info()
            .map_err(|e| refuse(&format!("credentials: {e}")))?;
        Ok(Source::Sentinel(Sentinels {
            sentinels,
            master: master.to_owned(),
            node: SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(node.redis_settings().clone()),
        }))
    }
}

/// The seeds of `redis+cluster://[user:password@]host:port[,host:port…][/]`
/// (the part after the scheme), each with the credentials. A cluster has
/// one database, so no db is taken.
fn parse_cluster(rest: &str) -> Result<Vec<ConnectionInfo>, ClusterError> {
    let refuse = |why: &str| {
        ClusterError::Unavailable(format!(
            "{why}: a Redis Cluster URL is redis+cluster://[user:password@]host:port[,host:port...]"
        ))
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !path.trim_end_matches('/').is_empty() {
        return Err(refuse("a Redis Cluster has no db to choose"));
    }
    let (user_info, hosts) = match authority.rsplit_once('@') {
        Some((user_info, hosts)) => (format!("{user_info}@"), hosts),
        None => (String::new(), authority),
    };
    let mut seeds = Vec::new();
    for host in hosts.split(',').filter(|h| !h.is_empty()) {
        let info = format!("redis://{user_info}{host}/")
            .into_connection_info()
            .map_err(|e| refuse(&format!("seed {host:?}: {e}")))?;
        seeds.push(info);
    }
    if seeds.is_empty() {
        return Err(refuse("no seed address"));
    }
    Ok(seeds)
}

/// A Sentinel deployment: the Sentinels to ask and the master they watch.
pub(super) struct Sentinels {
    sentinels: Vec<ConnectionInfo>,
    master: String,
    node: SentinelNodeConnectionInfo,
}

impl Sentinels {
    /// A handle asking these Sentinels (it keeps a connection to each).
    pub(super) fn connect(&self) -> Result<Primary, ClusterError> {
        let sentinel = Sentinel::build(self.sentinels.clone()).map_err(unavailable)?;
        Ok(Primary {
            sentinel,
            master: self.master.clone(),
            node: self.node.clone(),
        })
    }
}

/// Asks Sentinels where the primary is.
pub(super) struct Primary {
    sentinel: Sentinel,
    master: String,
    node: SentinelNodeConnectionInfo,
}

impl Primary {
    /// The primary the first answering Sentinel names, once that server
    /// confirmed it is a primary (the redis crate checks its `ROLE`): during
    /// a failover the old one may still be named, or be back as a replica.
    pub(super) async fn find(&mut self, timeout: Duration) -> Result<ConnectionInfo, ClusterError> {
        let find = self
            .sentinel
            .async_master_for(&self.master, Some(&self.node));
        match tokio::time::timeout(timeout, find).await {
            Ok(Ok(client)) => Ok(client.get_connection_info().clone()),
            Ok(Err(e)) => Err(unavailable(format!(
                "no primary for {:?} from the Sentinels: {e}",
                self.master
            ))),
            Err(_) => Err(unavailable(format!(
                "the Sentinels named no primary for {:?} within {timeout:?}",
                self.master
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinels(url: &str) -> Sentinels {
        match Source::parse(url) {
            Ok(Source::Sentinel(s)) => s,
            Ok(_) => panic!("{url}: not read as Sentinels"),
            Err(e) => panic!("{url}: {e}"),
        }
    }

    fn refusal(url: &str) -> String {
        match Source::parse(url) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{url} accepted"),
        }
    }

    #[test]
    fn reads_sentinels_master_db_and_credentials() {
        let s = sentinels("redis+sentinel://u:p%40ss@10.0.0.1:26380,[::1]:5000,host/mymaster/3");
        let addrs: Vec<String> = s.sentinels.iter().map(|i| i.addr().to_string()).collect();
        assert_eq!(addrs, ["10.0.0.1:26380", "::1:5000", "host:26379"]);
        assert_eq!(s.master, "mymaster");
        let plain = format!("{:?}", s.node);
        assert!(plain.contains("db: 3"), "{plain}");
        assert!(plain.contains("username: Some(\"u\")"), "{plain}");
    }

    #[test]
    fn a_plain_url_is_a_fixed_primary() {
        assert!(matches!(
            Source::parse("redis://127.0.0.1:6379/"),
            Ok(Source::Fixed(_))
        ));
    }

    #[test]
    fn reads_cluster_seeds_with_credentials() {
        let Ok(Source::Cluster(seeds)) =
            Source::parse("redis+cluster://u:p%40ss@10.0.0.1:7000,[::1]:7001,host:7002/")
        else {
            panic!("not read as a cluster");
        };
        let addrs: Vec<String> = seeds.iter().map(|i| i.addr().to_string()).collect();
        assert_eq!(addrs, ["10.0.0.1:7000", "::1:7001", "host:7002"]);
        let plain = format!("{:?}", seeds[1].redis_settings());
        assert!(plain.contains("username: Some(\"u\")"), "{plain}");
        assert!(refusal("redis+cluster://").contains("no seed address"));
        assert!(refusal("redis+cluster://h:7000/2").contains("no db to choose"));
    }

    #[test]
    fn refuses_sentinel_urls_without_master_or_sentinels() {
        assert!(refusal("redis+sentinel://h:26379").contains("no master name"));
        assert!(refusal("redis+sentinel://h:26379/").contains("no master name"));
        assert!(refusal("redis+sentinel:///m").contains("no Sentinel address"));
        assert!(refusal("redis+sentinel://h/m/x").contains("the db is not a number"));
    }
}
