//! The WalletConnect session methods (DECISIONS §10), each a subscribe and none, one or two
//! publishes with sign-client's tags: `wc_createTopic`, `wc_proposeSession`,
//! `wc_approveSession`; their params, their cost and their execution.

use std::borrow::Cow;

use super::publish::{publishes, Outgoing};
use super::{subscribe, Caller, Method, Outcome};
use crate::conn::Ctx;
use crate::limits::Cost;
use crate::rpc::params::{extra, string_param, Rules};
use crate::rpc::wire::Params;
use crate::rpc::RpcError;

/// sign-client's tags of the session set-up (DECISIONS §10).
const TAG_PROPOSE: u32 = 1100;
const TAG_PROPOSE_RESPONSE: u32 = 1101;
const TAG_SETTLE: u32 = 1102;

/// `wc_createTopic`: subscribes the caller, answers `true`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTopic<'a> {
    /// Topic.
    pub topic: Cow<'a, str>,
}

/// `wc_proposeSession`: subscribe to the pairing topic, publish the proposal there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposeSession<'a> {
    /// Pairing topic.
    pub pairing_topic: Cow<'a, str>,
    /// The proposal message.
    pub proposal: Cow<'a, str>,
    /// Seconds to keep it.
    pub ttl: u32,
}

/// `wc_approveSession`: subscribe to the session topic, publish the response on the
/// pairing topic and the settlement on the session topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApproveSession<'a> {
    /// Session topic.
    pub session_topic: Cow<'a, str>,
    /// Pairing topic.
    pub pairing_topic: Cow<'a, str>,
    /// The proposal's response.
    pub response: Cow<'a, str>,
    /// The settlement request.
    pub settlement: Cow<'a, str>,
    /// Seconds to keep them.
    pub ttl: u32,
}

impl<'a> Method<'a> for CreateTopic<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let topic = r.topic(p.topic.take(), "topic")?;
        Ok(CreateTopic { topic })
    }

    fn cost(&self) -> Cost {
        subscribe::cost(1)
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        c.subscribe(&self.topic, ctx)?;
        Ok(Outcome::Done)
    }
}

impl<'a> Method<'a> for ProposeSession<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let x = extra(p);
        Ok(ProposeSession {
            pairing_topic: r.topic(x.pairing_topic, "pairingTopic")?,
            proposal: string_param(x.session_proposal, "sessionProposal", usize::MAX)?,
            ttl: r.ttl(p.ttl.take())?,
        })
    }

    fn cost(&self) -> Cost {
        Cost {
            publishes: 1,
            bytes: self.proposal.len(),
            subscribes: 1,
        }
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        c.subscribe(&self.pairing_topic, ctx)?;
        let out = Outgoing {
            topic: &self.pairing_topic,
            message: &self.proposal,
            ttl: self.ttl,
            prompt: true,
            tag: TAG_PROPOSE,
            attestation: None,
        };
        let done = c.publish(out, ctx);
        publishes(&[done])
    }
}

impl<'a> Method<'a> for ApproveSession<'a> {
    fn parse(p: &mut Params<'a>, r: Rules) -> Result<Self, RpcError> {
        let x = extra(p);
        let response = "sessionProposalResponse";
        let settlement = "sessionSettlementRequest";
        Ok(ApproveSession {
            session_topic: r.topic(x.session_topic, "sessionTopic")?,
            pairing_topic: r.topic(x.pairing_topic, "pairingTopic")?,
            response: string_param(x.proposal_response, response, usize::MAX)?,
            settlement: string_param(x.settlement_request, settlement, usize::MAX)?,
            ttl: r.ttl(p.ttl.take())?,
        })
    }

    fn cost(&self) -> Cost {
        Cost {
            publishes: 2,
            bytes: self.response.len() + self.settlement.len(),
            subscribes: 1,
        }
    }

    fn run<S>(self, c: &mut Caller<'_, S>, ctx: &mut Ctx<'_>) -> Result<Outcome, RpcError> {
        c.subscribe(&self.session_topic, ctx)?;
        let out = |topic, message, tag| Outgoing {
            topic,
            message,
            ttl: self.ttl,
            prompt: false,
            tag,
            attestation: None,
        };
        let response = out(&self.pairing_topic, &self.response, TAG_PROPOSE_RESPONSE);
        let settlement = out(&self.session_topic, &self.settlement, TAG_SETTLE);
        let first = c.publish(response, ctx);
        let second = c.publish(settlement, ctx);
        publishes(&[first, second])
    }
}
