//! The JSON-RPC wire model: any JSON message reduced to what classification and validation
//! need ([`Top`], [`Envelope`], [`Loose`] values), with hand-written `serde` visitors that
//! accept every JSON shape, so that a wrong type becomes -32600/-32602 with a precise message
//! instead of a parse error, and that borrow strings from the input when they have no escapes.
//!
//! It owns only these private types; classification is `decode`'s; `params.rs` and each method's file in `conn/methods/` validate
//! what they need of [`Params`].

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Any JSON value, reduced to what validation needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Loose<'a> {
    Str(Cow<'a, str>),
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Null,
    Array,
    Object,
}

/// The `params` member.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Params<'a> {
    pub(crate) topic: Option<Loose<'a>>,
    pub(crate) message: Option<Loose<'a>>,
    pub(crate) ttl: Option<Loose<'a>>,
    pub(crate) prompt: Option<Loose<'a>>,
    pub(crate) id: Option<Loose<'a>>,
    /// `irn_publish`'s `tag`.
    pub(crate) tag: Option<Loose<'a>>,
    /// `irn_publish`'s `attestation`.
    pub(crate) attestation: Option<Loose<'a>>,
    /// The members of batch and session methods, when the object has any: apart, so that
    /// a publish's params do not carry their room.
    pub(crate) extra: Option<Box<Extra<'a>>>,
}

/// The members of `*_batch*` and `wc_*Session` params.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Extra<'a> {
    pub(crate) topics: Option<List<'a>>,
    pub(crate) subscriptions: Option<List<'a>>,
    /// `irn_batchReceive`'s list.
    pub(crate) receipts: Option<List<'a>>,
    pub(crate) pairing_topic: Option<Loose<'a>>,
    pub(crate) session_topic: Option<Loose<'a>>,
    pub(crate) session_proposal: Option<Loose<'a>>,
    pub(crate) proposal_response: Option<Loose<'a>>,
    pub(crate) settlement_request: Option<Loose<'a>>,
    /// `irn_watchRegister`'s JWT.
    pub(crate) register_auth: Option<Loose<'a>>,
    /// `irn_watchUnregister`'s JWT.
    pub(crate) unregister_auth: Option<Loose<'a>>,
}

impl<'a> Params<'a> {
    fn extra_mut(&mut self) -> &mut Extra<'a> {
        self.extra.get_or_insert_with(Box::default)
    }
}

/// Most elements a list member keeps (`topics`, `subscriptions`); a longer list is
/// [`List::TooLong`] (DECISIONS §10: batches of at most 500).
pub(crate) const MAX_LIST: usize = 500;

/// An array member of params.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum List<'a> {
    /// Its elements.
    Items(Vec<Elem<'a>>),
    /// More than [`MAX_LIST`] elements.
    TooLong,
    /// Not an array.
    NotArray,
}

/// An element of a list member.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Elem<'a> {
    /// A string (a topic).
    Str(Cow<'a, str>),
    /// An object (a subscription: `topic`, `id`).
    Sub {
        topic: Option<Loose<'a>>,
        id: Option<Loose<'a>>,
    },
    /// Anything else.
    Other,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum ParamsField<'a> {
    Object(Params<'a>),
    Other,
}

/// One element of a message: a request object, or something that is not one.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Envelope<'a> {
    pub(super) jsonrpc: Option<Loose<'a>>,
    pub(super) id: Option<Loose<'a>>,
    pub(super) method: Option<Loose<'a>>,
    pub(super) params: Option<ParamsField<'a>>,
    /// The members of a v1 frame, when the object has any: apart, so that a JSON-RPC
    /// element (every publish) does not carry and move their room.
    pub(super) v1: Option<Box<V1Members<'a>>>,
    /// False when the element is not a JSON object at all.
    pub(super) is_object: bool,
    /// The object has a `result` or an `error` member: a response from the client (an
    /// acknowledgement) when it has no `method` (DECISIONS §3, §8).
    pub(super) response: bool,
}

/// The top-level members of a WalletConnect 1.0 frame.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct V1Members<'a> {
    /// `topic`.
    pub(super) topic: Option<Loose<'a>>,
    /// `type`.
    pub(super) kind: Option<Loose<'a>>,
    /// `payload`.
    pub(super) payload: Option<Loose<'a>>,
    /// `silent`.
    pub(super) silent: Option<Loose<'a>>,
}

/// A whole message: one element or a batch.
#[allow(
    clippy::large_enum_variant,
    reason = "lives on the stack while one message is classified; boxing would allocate per message"
)]
pub(super) enum Top<'a> {
    /// One element.
    One(Envelope<'a>),
    /// A batch.
    Many(Vec<Envelope<'a>>),
}

impl<'de> Deserialize<'de> for Top<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON-RPC message")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Ok(Top::One(envelope_from_map(map)?))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = seq.next_element::<Envelope<'de>>()? {
                    v.push(e);
                }
                Ok(Top::Many(v))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Top::One(Envelope::not_object()))
            }
        }
        d.deserialize_any(V)
    }
}

impl Envelope<'_> {
    pub(super) fn not_object() -> Self {
        Envelope {
            is_object: false,
            response: false,
            ..Envelope::object()
        }
    }

    pub(super) fn object() -> Self {
        Envelope {
            jsonrpc: None,
            id: None,
            method: None,
            params: None,
            v1: None,
            is_object: true,
            response: false,
        }
    }
}

impl<'a> Envelope<'a> {
    /// The v1 members, made room for.
    fn v1_mut(&mut self) -> &mut V1Members<'a> {
        self.v1.get_or_insert_with(Box::default)
    }
}

/// An object member's name, borrowed from the input when it has no escapes (serde's own
/// `Cow<str>` always allocates: ten allocations per publish).
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Where a member's value goes: the one table of member names, shared by the `serde`
/// visitors here and the fast path (`fast.rs`), so both fill the same fields the same way.
pub(super) enum Slot<'s, 'a> {
    /// Any value, reduced to a [`Loose`].
    Loose(&'s mut Option<Loose<'a>>),
    /// The `params` member.
    Params(&'s mut Option<ParamsField<'a>>),
    /// A list member of params.
    List(&'s mut Option<List<'a>>),
    /// An unknown member: its value is checked to be JSON and dropped.
    Ignore,
    /// A member whose presence is all that counts: its value is checked to be JSON and
    /// dropped, and the flag set.
    Mark(&'s mut bool),
}

impl<'a> Envelope<'a> {
    /// The slot of top-level member `key` (the last of duplicate members wins).
    pub(super) fn slot(&mut self, key: &str) -> Slot<'_, 'a> {
        match key {
            "jsonrpc" => Slot::Loose(&mut self.jsonrpc),
            "id" => Slot::Loose(&mut self.id),
            "method" => Slot::Loose(&mut self.method),
            "params" => Slot::Params(&mut self.params),
            "topic" => Slot::Loose(&mut self.v1_mut().topic),
            "type" => Slot::Loose(&mut self.v1_mut().kind),
            "payload" => Slot::Loose(&mut self.v1_mut().payload),
            "silent" => Slot::Loose(&mut self.v1_mut().silent),
            "result" | "error" => Slot::Mark(&mut self.response),
            _ => Slot::Ignore,
        }
    }
}

impl<'a> Params<'a> {
    /// The slot of params member `key` (the last of duplicate members wins).
    pub(super) fn slot(&mut self, key: &str) -> Slot<'_, 'a> {
        match key {
            "topic" => Slot::Loose(&mut self.topic),
            "message" => Slot::Loose(&mut self.message),
            "ttl" => Slot::Loose(&mut self.ttl),
            "prompt" => Slot::Loose(&mut self.prompt),
            "id" => Slot::Loose(&mut self.id),
            "tag" => Slot::Loose(&mut self.tag),
            "attestation" => Slot::Loose(&mut self.attestation),
            "topics" => Slot::List(&mut self.extra_mut().topics),
            "subscriptions" => Slot::List(&mut self.extra_mut().subscriptions),
            "receipts" => Slot::List(&mut self.extra_mut().receipts),
            "pairingTopic" => Slot::Loose(&mut self.extra_mut().pairing_topic),
            "sessionTopic" => Slot::Loose(&mut self.extra_mut().session_topic),
            "sessionProposal" => Slot::Loose(&mut self.extra_mut().session_proposal),
            "sessionProposalResponse" => Slot::Loose(&mut self.extra_mut().proposal_response),
            "sessionSettlementRequest" => Slot::Loose(&mut self.extra_mut().settlement_request),
            "registerAuth" => Slot::Loose(&mut self.extra_mut().register_auth),
            "unregisterAuth" => Slot::Loose(&mut self.extra_mut().unregister_auth),
            _ => Slot::Ignore,
        }
    }
}

/// The slot of member `key` of a subscription object (an element of `subscriptions`) or of
/// a receipt (of `receipts`: its message id, `message_id` or `messageId`, takes the `id`
/// slot; a subscription's id is a string, a receipt's a number, so neither passes for the
/// other).
pub(super) fn sub_slot<'s, 'a>(
    topic: &'s mut Option<Loose<'a>>,
    id: &'s mut Option<Loose<'a>>,
    key: &str,
) -> Slot<'s, 'a> {
    match key {
        "topic" => Slot::Loose(topic),
        "id" | "message_id" | "messageId" => Slot::Loose(id),
        _ => Slot::Ignore,
    }
}

/// Reads the value of the member whose slot is `slot` from `map`.
fn fill<'de, A: MapAccess<'de>>(map: &mut A, slot: Slot<'_, 'de>) -> Result<(), A::Error> {
    match slot {
        Slot::Loose(s) => *s = Some(map.next_value()?),
        Slot::Params(s) => *s = Some(map.next_value()?),
        Slot::List(s) => *s = Some(map.next_value()?),
        Slot::Ignore => {
            map.next_value::<IgnoredAny>()?;
        }
        Slot::Mark(flag) => {
            map.next_value::<IgnoredAny>()?;
            *flag = true;
        }
    }
    Ok(())
}

fn envelope_from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Envelope<'de>, A::Error> {
    let mut e = Envelope::object();
    while let Some(k) = map.next_key::<Key<'de>>()? {
        fill(&mut map, e.slot(&k.0))?;
    }
    Ok(e)
}

impl<'de> Deserialize<'de> for Envelope<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Envelope<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON-RPC object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                envelope_from_map(map)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Envelope::not_object())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Envelope::not_object())
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for ParamsField<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ParamsField<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("params")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut p = Params::default();
                while let Some(k) = map.next_key::<Key<'de>>()? {
                    fill(&mut map, p.slot(&k.0))?;
                }
                Ok(ParamsField::Object(p))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ParamsField::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ParamsField::Other)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Loose<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Loose<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Loose::U64(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(if v >= 0 {
                    Loose::U64(v as u64)
                } else {
                    Loose::I64(v)
                })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Loose::F64(v))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(Loose::Bool(v))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Loose::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Loose::Null)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Loose::Object)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Loose::Array)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for List<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = List<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = seq.next_element::<Elem<'de>>()? {
                    if v.len() == MAX_LIST {
                        while seq.next_element::<IgnoredAny>()?.is_some() {}
                        return Ok(List::TooLong);
                    }
                    v.push(e);
                }
                Ok(List::Items(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(List::NotArray)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(List::NotArray)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(List::NotArray)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(List::NotArray)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(List::NotArray)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(List::NotArray)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(List::NotArray)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(List::NotArray)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Elem<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Elem<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list element")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Elem::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Elem::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Elem::Str(Cow::Owned(v)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut topic, mut id) = (None, None);
                while let Some(k) = map.next_key::<Key<'de>>()? {
                    fill(&mut map, sub_slot(&mut topic, &mut id, &k.0))?;
                }
                Ok(Elem::Sub { topic, id })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Elem::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Elem::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Elem::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Elem::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Elem::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Elem::Other)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Elem::Other)
            }
        }
        d.deserialize_any(V)
    }
}
