//! What an identity may do in a room: the rights a signed token grants,
//! parsed once when the token is verified and checked on every frame.
//!
//! A token names rooms (an exact id, a prefix ending in `*`, or `*` for any
//! room) and, for each, a list of rights. The most specific name wins: an
//! exact id over any prefix, a longer prefix over a shorter one, any prefix
//! over `*`. Rights are not added up across names, so a token can grant
//! much in general and less in one room.

use std::sync::Arc;

/// One thing a member may do in a room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    /// Enter the room (`join`, and resuming a session in it).
    Join,
    /// Publish on a channel (see [`Rights::may_publish`] for which).
    Publish,
    /// `entity.*` requests.
    Entities,
    /// `lock.*` requests.
    Locks,
    /// `direct` messages.
    Direct,
    /// `space.move` and `space.jump`.
    Move,
    /// Admin actions: kick members, list them, delete the room.
    Admin,
}

impl Right {
    const fn bit(self) -> u8 {
        1 << self as u8
    }

    /// The right's name in a token.
    pub fn as_str(self) -> &'static str {
        match self {
            Right::Join => "join",
            Right::Publish => "publish",
            Right::Entities => "entities",
            Right::Locks => "locks",
            Right::Direct => "direct",
            Right::Move => "move",
            Right::Admin => "admin",
        }
    }

    const ALL: [Right; 7] = [
        Right::Join,
        Right::Publish,
        Right::Entities,
        Right::Locks,
        Right::Direct,
        Right::Move,
        Right::Admin,
    ];
}

/// The rights in one room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rights {
    bits: u8,
    /// Channels `publish:<channel>` names; `None` when `publish` grants all.
    channels: Option<Box<[String]>>,
}

impl Rights {
    /// Every right but [`Right::Admin`]: what an anonymous member has on a
    /// server without keys, or with a ticket.
    pub fn member() -> Rights {
        let bits = Right::ALL
            .iter()
            .filter(|r| **r != Right::Admin)
            .fold(0, |b, r| b | r.bit());
        Rights {
            bits,
            channels: None,
        }
    }

    /// Every right, [`Right::Admin`] included.
    pub fn all() -> Rights {
        Rights {
            bits: Right::ALL.iter().fold(0, |b, r| b | r.bit()),
            channels: None,
        }
    }

    /// Parses a token's list of rights: right names, `publish:<channel>`
    /// for one channel, `*` for every right. An unknown name is an error
    /// (a typo must not silently grant less, or more, than meant).
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Rights, String> {
        let mut bits = 0u8;
        let mut channels: Vec<String> = Vec::new();
        let mut all_channels = false;
        for name in names {
            let name = name.as_ref();
            if name == "*" {
                return Ok(Rights::all());
            }
            if let Some(channel) = name.strip_prefix("publish:") {
                if channel.is_empty() {
                    return Err("right \"publish:\" names no channel".into());
                }
                bits |= Right::Publish.bit();
                if !channels.iter().any(|c| c == channel) {
                    channels.push(channel.to_owned());
                }
                continue;
            }
            let Some(right) = Right::ALL.iter().find(|r| r.as_str() == name) else {
                return Err(format!("unknown right {name:?}"));
            };
            if *right == Right::Publish {
                all_channels = true;
            }
            bits |= right.bit();
        }
        let channels = (!all_channels).then(|| channels.into_boxed_slice());
        Ok(Rights { bits, channels })
    }

    /// Whether `right` is granted (for [`Right::Publish`]: on some channel).
    pub fn may(&self, right: Right) -> bool {
        self.bits & right.bit() != 0
    }

    /// Whether publishing on `channel` is granted.
    pub fn may_publish(&self, channel: &str) -> bool {
        self.may(Right::Publish)
            && self
                .channels
                .as_ref()
                .is_none_or(|cs| cs.iter().any(|c| c == channel))
    }
}

/// Rights per room, as a token grants them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomGrants {
    /// Exact room ids.
    exact: Vec<(String, Arc<Rights>)>,
    /// Prefixes (the name less its `*`), longest first.
    prefixes: Vec<(String, Arc<Rights>)>,
    /// `*`: any other room.
    any: Option<Arc<Rights>>,
}

impl RoomGrants {
    /// Builds the grants from `(room name, rights)` pairs; a name ending in
    /// `*` is a prefix. Names must be distinct (a token's JSON object keys are).
    pub fn new(entries: impl IntoIterator<Item = (String, Rights)>) -> RoomGrants {
        let mut g = RoomGrants::default();
        for (name, rights) in entries {
            let rights = Arc::new(rights);
            if name == "*" {
                g.any = Some(rights);
            } else if let Some(prefix) = name.strip_suffix('*') {
                g.prefixes.push((prefix.to_owned(), rights));
            } else {
                g.exact.push((name, rights));
            }
        }
        g.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        g
    }

    /// The rights in `room`: those of its most specific name, or `None`
    /// when the token names no room that matches.
    pub fn for_room(&self, room: &str) -> Option<&Arc<Rights>> {
        self.exact
            .iter()
            .find(|(r, _)| r == room)
            .or_else(|| self.prefixes.iter().find(|(p, _)| room.starts_with(p)))
            .map(|(_, rights)| rights)
            .or(self.any.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(entries: &[(&str, &[&str])]) -> RoomGrants {
        RoomGrants::new(
            entries
                .iter()
                .map(|(n, r)| (n.to_string(), Rights::parse(r).unwrap())),
        )
    }

    #[test]
    fn each_right_is_granted_only_when_named() {
        for right in Right::ALL {
            let r = Rights::parse(&[right.as_str()]).unwrap();
            for other in Right::ALL {
                assert_eq!(r.may(other), other == right, "{right:?} granting {other:?}");
            }
        }
        let none = Rights::parse::<&str>(&[]).unwrap();
        assert!(Right::ALL.iter().all(|r| !none.may(*r)));
        assert!(!none.may_publish("main"));
    }

    #[test]
    fn star_grants_everything_and_member_everything_but_admin() {
        let all = Rights::parse(&["join", "*"]).unwrap();
        assert_eq!(all, Rights::all());
        assert!(all.may_publish("anything"));
        let m = Rights::member();
        assert!(!m.may(Right::Admin));
        assert!(Right::ALL
            .iter()
            .filter(|r| **r != Right::Admin)
            .all(|r| m.may(*r)));
        assert!(m.may_publish("xr"));
    }

    #[test]
    fn publish_can_be_limited_to_channels() {
        let r = Rights::parse(&["publish:main", "publish:xr"]).unwrap();
        assert!(r.may_publish("main") && r.may_publish("xr"));
        assert!(!r.may_publish("chat"));
        // Plain `publish` widens to every channel, whatever the order.
        let r = Rights::parse(&["publish:xr", "publish"]).unwrap();
        assert!(r.may_publish("chat"));
        let r = Rights::parse(&["publish", "publish:xr"]).unwrap();
        assert!(r.may_publish("chat"));
    }

    #[test]
    fn unknown_or_empty_names_are_errors() {
        assert!(Rights::parse(&["jion"]).unwrap_err().contains("jion"));
        assert!(Rights::parse(&["publish:"]).is_err());
        assert!(Rights::parse(&["Join"]).is_err());
    }

    #[test]
    fn the_most_specific_room_name_wins() {
        let g = grants(&[
            ("*", &["join"]),
            ("team-*", &["join", "publish"]),
            ("team-a-*", &["join", "admin"]),
            ("team-a-lobby", &[]),
        ]);
        let may = |room: &str, right| g.for_room(room).is_some_and(|r| r.may(right));
        assert!(may("elsewhere", Right::Join) && !may("elsewhere", Right::Publish));
        assert!(may("team-b", Right::Publish) && !may("team-b", Right::Admin));
        assert!(may("team-a-x", Right::Admin) && !may("team-a-x", Right::Publish));
        assert!(!may("team-a-lobby", Right::Join));
        assert!(g.for_room("team-a-lobby").is_some());
    }

    #[test]
    fn rooms_not_named_have_no_rights() {
        let g = grants(&[("lobby", &["*"]), ("team-*", &["join"])]);
        assert!(g.for_room("lobby2").is_none());
        assert!(g.for_room("team").is_none());
        assert!(g.for_room("team-").is_some());
        assert!(RoomGrants::default().for_room("lobby").is_none());
    }
}
