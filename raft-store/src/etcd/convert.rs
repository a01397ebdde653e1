//! Conversions between etcd's wire types (`etcdserverpb`, `mvccpb`) and
//! Skiff's [`types`](crate::types).
//!
//! Requests come in through the fallible `*_command` / [`range_request`]
//! functions, which apply etcd's validation (`server/etcdserver/api/v3rpc/key.go`
//! and the proposal size limit) before anything reaches the store, so a bad
//! request fails with the same code and message as on etcd. Results go back
//! out through the `*_response` functions. The `From` impls from Skiff's
//! request types to wire types serve clients and tests.

use prost::Message;
use skiff_proto::etcdserverpb as pb;
use skiff_proto::etcdserverpb::compare::{CompareResult as WireResult, CompareTarget as WireTarget, TargetUnion};
use skiff_proto::etcdserverpb::range_request::{SortOrder as WireSortOrder, SortTarget as WireSortTarget};
use skiff_proto::etcdserverpb::{request_op, response_op};
use skiff_proto::mvccpb;

use crate::mvcc::EventKind;
use crate::types::{
    Command, Compare, CompareResult, CompareTarget, DeleteRequest, KeyValue, Op, OpResult, PutRequest, RangeRequest,
    RangeResult, SortOrder, SortTarget, Txn, TxnResult,
};

/// Largest request accepted into the log, in encoded bytes: etcd's
/// `--max-request-bytes` default (1.5 MiB).
pub const MAX_REQUEST_BYTES: usize = 1_572_864;

/// Most operations in one branch of a txn (nested txns share the budget):
/// etcd's `--max-txn-ops` default.
pub const MAX_TXN_OPS: usize = 128;

/// A request etcd would refuse before proposing it. Each message is etcd's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: request is too large")]
    TooLarge { size: usize },
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    /// `ignore_value` together with a value.
    #[error("etcdserver: value is provided")]
    ValueProvided,
    /// `ignore_lease` together with a lease.
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// A txn op with no request in it (etcd answers this with "key not found").
    #[error("etcdserver: key not found")]
    EmptyOp,
    #[error("etcdserver: invalid sort option")]
    InvalidSortOption,
    /// A compare whose result or target is not one etcd defines.
    #[error("etcdserver: invalid compare result or target")]
    InvalidCompare,
}

// ----------------------------------------------------------------- requests

/// A `Put`, validated, as the one-op txn it is replicated as.
pub fn put_command(req: pb::PutRequest) -> Result<Command, RequestError> {
    let size = req.encoded_len();
    let op = Op::Put(put_request(req)?);
    within_limit(size)?;
    Ok(one_op_txn(op))
}

/// A `DeleteRange`, validated, as the one-op txn it is replicated as.
pub fn delete_command(req: pb::DeleteRangeRequest) -> Result<Command, RequestError> {
    let size = req.encoded_len();
    let op = Op::DeleteRange(delete_request(req)?);
    within_limit(size)?;
    Ok(one_op_txn(op))
}

/// A `Txn`, validated (nested txns included).
pub fn txn_command(req: pb::TxnRequest) -> Result<Command, RequestError> {
    let size = req.encoded_len();
    let txn = txn(req, MAX_TXN_OPS)?;
    within_limit(size)?;
    Ok(Command::Txn(txn))
}

/// A `Range`, validated. `serializable` is the caller's to read first: it
/// says how to serve the read, not what to read.
pub fn range_request(req: pb::RangeRequest) -> Result<RangeRequest, RequestError> {
    require_key(&req.key)?;
    Ok(RangeRequest {
        key: req.key,
        range_end: req.range_end,
        limit: req.limit,
        revision: req.revision,
        sort_order: sort_order(req.sort_order)?,
        sort_target: sort_target(req.sort_target)?,
        keys_only: req.keys_only,
        count_only: req.count_only,
        min_mod_revision: req.min_mod_revision,
        max_mod_revision: req.max_mod_revision,
        min_create_revision: req.min_create_revision,
        max_create_revision: req.max_create_revision,
    })
}

fn within_limit(size: usize) -> Result<(), RequestError> {
    if size > MAX_REQUEST_BYTES {
        return Err(RequestError::TooLarge { size });
    }
    Ok(())
}

fn one_op_txn(op: Op) -> Command {
    Command::Txn(Txn { compare: Vec::new(), success: vec![op], failure: Vec::new() })
}

fn require_key(key: &[u8]) -> Result<(), RequestError> {
    if key.is_empty() {
        return Err(RequestError::EmptyKey);
    }
    Ok(())
}

fn put_request(req: pb::PutRequest) -> Result<PutRequest, RequestError> {
    require_key(&req.key)?;
    if req.ignore_value && !req.value.is_empty() {
        return Err(RequestError::ValueProvided);
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(RequestError::LeaseProvided);
    }
    Ok(PutRequest {
        key: req.key,
        value: req.value,
        lease: req.lease,
        prev_kv: req.prev_kv,
        ignore_value: req.ignore_value,
        ignore_lease: req.ignore_lease,
    })
}

fn delete_request(req: pb::DeleteRangeRequest) -> Result<DeleteRequest, RequestError> {
    require_key(&req.key)?;
    Ok(DeleteRequest { key: req.key, range_end: req.range_end, prev_kv: req.prev_kv })
}

/// etcd's `checkTxnRequest`: the widest of the three lists counts against
/// `max_ops`, and nested txns get what is left.
fn txn(req: pb::TxnRequest, max_ops: usize) -> Result<Txn, RequestError> {
    let ops = req.compare.len().max(req.success.len()).max(req.failure.len());
    if ops > max_ops {
        return Err(RequestError::TooManyOps);
    }
    let left = max_ops - ops;
    let ops_of = |list: Vec<pb::RequestOp>| list.into_iter().map(|o| op(o, left)).collect::<Result<Vec<_>, _>>();
    Ok(Txn {
        compare: req.compare.into_iter().map(compare).collect::<Result<_, _>>()?,
        success: ops_of(req.success)?,
        failure: ops_of(req.failure)?,
    })
}

fn op(req: pb::RequestOp, max_ops: usize) -> Result<Op, RequestError> {
    match req.request.ok_or(RequestError::EmptyOp)? {
        request_op::Request::RequestRange(r) => range_request(r).map(Op::Range),
        request_op::Request::RequestPut(r) => put_request(r).map(Op::Put),
        request_op::Request::RequestDeleteRange(r) => delete_request(r).map(Op::DeleteRange),
        request_op::Request::RequestTxn(r) => txn(r, max_ops).map(Op::Txn),
    }
}

/// A target value missing from (or of another type than) the target is
/// taken as the zero value, as etcd's `c.GetVersion()` and friends do.
fn compare(c: pb::Compare) -> Result<Compare, RequestError> {
    require_key(&c.key)?;
    let result = match WireResult::try_from(c.result).map_err(|_| RequestError::InvalidCompare)? {
        WireResult::Equal => CompareResult::Equal,
        WireResult::Greater => CompareResult::Greater,
        WireResult::Less => CompareResult::Less,
        WireResult::NotEqual => CompareResult::NotEqual,
    };
    let target = match (WireTarget::try_from(c.target).map_err(|_| RequestError::InvalidCompare)?, c.target_union) {
        (WireTarget::Version, Some(TargetUnion::Version(v))) => CompareTarget::Version(v),
        (WireTarget::Version, _) => CompareTarget::Version(0),
        (WireTarget::Create, Some(TargetUnion::CreateRevision(v))) => CompareTarget::CreateRevision(v),
        (WireTarget::Create, _) => CompareTarget::CreateRevision(0),
        (WireTarget::Mod, Some(TargetUnion::ModRevision(v))) => CompareTarget::ModRevision(v),
        (WireTarget::Mod, _) => CompareTarget::ModRevision(0),
        (WireTarget::Value, Some(TargetUnion::Value(v))) => CompareTarget::Value(v),
        (WireTarget::Value, _) => CompareTarget::Value(Vec::new()),
        (WireTarget::Lease, Some(TargetUnion::Lease(v))) => CompareTarget::Lease(v),
        (WireTarget::Lease, _) => CompareTarget::Lease(0),
    };
    Ok(Compare { result, target, key: c.key, range_end: c.range_end })
}

fn sort_order(wire: i32) -> Result<SortOrder, RequestError> {
    Ok(match WireSortOrder::try_from(wire).map_err(|_| RequestError::InvalidSortOption)? {
        WireSortOrder::None => SortOrder::None,
        WireSortOrder::Ascend => SortOrder::Ascend,
        WireSortOrder::Descend => SortOrder::Descend,
    })
}

fn sort_target(wire: i32) -> Result<SortTarget, RequestError> {
    Ok(match WireSortTarget::try_from(wire).map_err(|_| RequestError::InvalidSortOption)? {
        WireSortTarget::Key => SortTarget::Key,
        WireSortTarget::Version => SortTarget::Version,
        WireSortTarget::Create => SortTarget::Create,
        WireSortTarget::Mod => SortTarget::Mod,
        WireSortTarget::Value => SortTarget::Value,
    })
}

// -------------------------------------------------- requests, back to wire

impl From<RangeRequest> for pb::RangeRequest {
    fn from(r: RangeRequest) -> Self {
        let sort_order = match r.sort_order {
            SortOrder::None => WireSortOrder::None,
            SortOrder::Ascend => WireSortOrder::Ascend,
            SortOrder::Descend => WireSortOrder::Descend,
        };
        let sort_target = match r.sort_target {
            SortTarget::Key => WireSortTarget::Key,
            SortTarget::Version => WireSortTarget::Version,
            SortTarget::Create => WireSortTarget::Create,
            SortTarget::Mod => WireSortTarget::Mod,
            SortTarget::Value => WireSortTarget::Value,
        };
        pb::RangeRequest {
            key: r.key,
            range_end: r.range_end,
            limit: r.limit,
            revision: r.revision,
            sort_order: sort_order as i32,
            sort_target: sort_target as i32,
            serializable: false,
            keys_only: r.keys_only,
            count_only: r.count_only,
            min_mod_revision: r.min_mod_revision,
            max_mod_revision: r.max_mod_revision,
            min_create_revision: r.min_create_revision,
            max_create_revision: r.max_create_revision,
        }
    }
}

impl From<PutRequest> for pb::PutRequest {
    fn from(r: PutRequest) -> Self {
        pb::PutRequest {
            key: r.key,
            value: r.value,
            lease: r.lease,
            prev_kv: r.prev_kv,
            ignore_value: r.ignore_value,
            ignore_lease: r.ignore_lease,
        }
    }
}

impl From<DeleteRequest> for pb::DeleteRangeRequest {
    fn from(r: DeleteRequest) -> Self {
        pb::DeleteRangeRequest { key: r.key, range_end: r.range_end, prev_kv: r.prev_kv }
    }
}

impl From<Compare> for pb::Compare {
    fn from(c: Compare) -> Self {
        let result = match c.result {
            CompareResult::Equal => WireResult::Equal,
            CompareResult::Greater => WireResult::Greater,
            CompareResult::Less => WireResult::Less,
            CompareResult::NotEqual => WireResult::NotEqual,
        };
        let (target, union) = match c.target {
            CompareTarget::Version(v) => (WireTarget::Version, TargetUnion::Version(v)),
            CompareTarget::CreateRevision(v) => (WireTarget::Create, TargetUnion::CreateRevision(v)),
            CompareTarget::ModRevision(v) => (WireTarget::Mod, TargetUnion::ModRevision(v)),
            CompareTarget::Value(v) => (WireTarget::Value, TargetUnion::Value(v)),
            CompareTarget::Lease(v) => (WireTarget::Lease, TargetUnion::Lease(v)),
        };
        pb::Compare {
            result: result as i32,
            target: target as i32,
            key: c.key,
            range_end: c.range_end,
            target_union: Some(union),
        }
    }
}

impl From<Op> for pb::RequestOp {
    fn from(op: Op) -> Self {
        let request = match op {
            Op::Range(r) => request_op::Request::RequestRange(r.into()),
            Op::Put(r) => request_op::Request::RequestPut(r.into()),
            Op::DeleteRange(r) => request_op::Request::RequestDeleteRange(r.into()),
            Op::Txn(t) => request_op::Request::RequestTxn(t.into()),
        };
        pb::RequestOp { request: Some(request) }
    }
}

impl From<Txn> for pb::TxnRequest {
    fn from(t: Txn) -> Self {
        pb::TxnRequest {
            compare: t.compare.into_iter().map(Into::into).collect(),
            success: t.success.into_iter().map(Into::into).collect(),
            failure: t.failure.into_iter().map(Into::into).collect(),
        }
    }
}

// ---------------------------------------------------------------- results

impl From<KeyValue> for mvccpb::KeyValue {
    fn from(kv: KeyValue) -> Self {
        mvccpb::KeyValue {
            key: kv.key,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            value: kv.value,
            lease: kv.lease,
        }
    }
}

impl From<EventKind> for mvccpb::event::EventType {
    fn from(kind: EventKind) -> Self {
        match kind {
            EventKind::Put => mvccpb::event::EventType::Put,
            EventKind::Delete => mvccpb::event::EventType::Delete,
        }
    }
}

/// The header etcd puts on responses nested in a txn: the revision only.
/// Top-level responses get the full header from their service.
fn revision_header(revision: i64) -> Option<pb::ResponseHeader> {
    Some(pb::ResponseHeader { revision, ..Default::default() })
}

fn kvs(kvs: Vec<KeyValue>) -> Vec<mvccpb::KeyValue> {
    kvs.into_iter().map(Into::into).collect()
}

/// A range result at store revision `revision`.
pub fn range_response(r: RangeResult, revision: i64) -> pb::RangeResponse {
    pb::RangeResponse { header: revision_header(revision), kvs: kvs(r.kvs), more: r.more, count: r.count }
}

/// A txn result; `revision` is the store revision after the txn.
pub fn txn_response(r: TxnResult, revision: i64) -> pb::TxnResponse {
    pb::TxnResponse {
        header: revision_header(revision),
        succeeded: r.succeeded,
        responses: r.responses.into_iter().map(|op| response_op(op, revision)).collect(),
    }
}

/// One op's result inside a txn response.
pub fn response_op(r: OpResult, revision: i64) -> pb::ResponseOp {
    let response = match r {
        OpResult::Range(r) => response_op::Response::ResponseRange(range_response(r, revision)),
        OpResult::Put { prev_kv } => response_op::Response::ResponsePut(pb::PutResponse {
            header: revision_header(revision),
            prev_kv: prev_kv.map(Into::into),
        }),
        OpResult::DeleteRange { deleted, prev_kvs } => {
            response_op::Response::ResponseDeleteRange(pb::DeleteRangeResponse {
                header: revision_header(revision),
                deleted,
                prev_kvs: kvs(prev_kvs),
            })
        }
        OpResult::Txn(t) => response_op::Response::ResponseTxn(txn_response(t, revision)),
    };
    pb::ResponseOp { response: Some(response) }
}

/// The response to a [`put_command`]; `None` if `r` is not one put's result.
pub fn put_response(r: TxnResult, revision: i64) -> Option<pb::PutResponse> {
    match only_response(r, revision)? {
        response_op::Response::ResponsePut(p) => Some(p),
        _ => None,
    }
}

/// The response to a [`delete_command`]; `None` if `r` is not one delete's result.
pub fn delete_response(r: TxnResult, revision: i64) -> Option<pb::DeleteRangeResponse> {
    match only_response(r, revision)? {
        response_op::Response::ResponseDeleteRange(d) => Some(d),
        _ => None,
    }
}

fn only_response(r: TxnResult, revision: i64) -> Option<response_op::Response> {
    let mut responses = r.responses.into_iter();
    match (responses.next(), responses.next()) {
        (Some(op), None) => response_op(op, revision).response,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use tonic::{Code, Status};

    use super::*;

    fn key(k: &str) -> Vec<u8> {
        k.as_bytes().to_vec()
    }

    fn nested_txn() -> Txn {
        let inner = Txn {
            compare: vec![Compare {
                result: CompareResult::NotEqual,
                target: CompareTarget::Lease(7),
                key: key("c"),
                range_end: Vec::new(),
            }],
            success: vec![Op::DeleteRange(DeleteRequest { key: key("d"), range_end: key("e"), prev_kv: true })],
            failure: vec![Op::Range(RangeRequest { key: key("f"), count_only: true, ..Default::default() })],
        };
        Txn {
            compare: vec![
                Compare {
                    result: CompareResult::Equal,
                    target: CompareTarget::Value(key("v")),
                    key: key("a"),
                    range_end: Vec::new(),
                },
                Compare {
                    result: CompareResult::Less,
                    target: CompareTarget::ModRevision(9),
                    key: key("a"),
                    range_end: key("b"),
                },
                Compare {
                    result: CompareResult::Greater,
                    target: CompareTarget::CreateRevision(3),
                    key: key("x"),
                    range_end: vec![0],
                },
                Compare {
                    result: CompareResult::Equal,
                    target: CompareTarget::Version(0),
                    key: key("y"),
                    range_end: Vec::new(),
                },
            ],
            success: vec![
                Op::Put(PutRequest { key: key("a"), value: key("1"), lease: 5, prev_kv: true, ..Default::default() }),
                Op::Txn(inner),
            ],
            failure: vec![Op::Range(RangeRequest {
                key: key("a"),
                range_end: key("z"),
                limit: 10,
                revision: 4,
                sort_order: SortOrder::Descend,
                sort_target: SortTarget::Mod,
                keys_only: true,
                min_mod_revision: 1,
                max_create_revision: 8,
                ..Default::default()
            })],
        }
    }

    fn rejected(r: Result<Command, RequestError>) -> Status {
        Status::from(r.expect_err("request must be rejected"))
    }

    #[test]
    fn nested_txn_round_trips() {
        let txn = nested_txn();
        let wire = pb::TxnRequest::from(txn.clone());
        assert_eq!(txn_command(wire.clone()), Ok(Command::Txn(txn.clone())));
        assert_eq!(pb::TxnRequest::from(txn), wire);
    }

    #[test]
    fn nested_txn_result_maps_to_nested_responses() {
        let kv = KeyValue { key: key("a"), create_revision: 2, mod_revision: 3, version: 2, value: key("1"), lease: 0 };
        let result = TxnResult {
            succeeded: true,
            responses: vec![
                OpResult::Put { prev_kv: Some(kv.clone()) },
                OpResult::Txn(TxnResult {
                    succeeded: false,
                    responses: vec![OpResult::Range(RangeResult { kvs: vec![kv.clone()], more: true, count: 4 })],
                }),
            ],
        };
        let response = txn_response(result, 12);
        assert!(response.succeeded);
        let Some(response_op::Response::ResponsePut(put)) = &response.responses[0].response else {
            panic!("first response must be a put: {response:?}")
        };
        assert_eq!(put.prev_kv, Some(mvccpb::KeyValue::from(kv.clone())));
        let Some(response_op::Response::ResponseTxn(inner)) = &response.responses[1].response else {
            panic!("second response must be a txn: {response:?}")
        };
        assert!(!inner.succeeded);
        let Some(response_op::Response::ResponseRange(range)) = &inner.responses[0].response else {
            panic!("nested response must be a range: {inner:?}")
        };
        assert_eq!((range.kvs.len(), range.more, range.count), (1, true, 4));
        assert_eq!(range.header.as_ref().map(|h| h.revision), Some(12));
    }

    #[test]
    fn empty_keys_are_rejected_with_etcds_error() {
        let no_key = |status: Status| {
            assert_eq!((status.code(), status.message()), (Code::InvalidArgument, "etcdserver: key is not provided"))
        };
        no_key(rejected(put_command(pb::PutRequest { value: key("v"), ..Default::default() })));
        no_key(rejected(delete_command(pb::DeleteRangeRequest::default())));
        no_key(Status::from(range_request(pb::RangeRequest::default()).expect_err("empty range key")));
        let mut txn = nested_txn();
        txn.compare[1].key.clear();
        no_key(rejected(txn_command(txn.into())));
        let mut txn = nested_txn();
        let Op::Txn(inner) = &mut txn.success[1] else { unreachable!("nested_txn's second op is a txn") };
        inner.success = vec![Op::Put(PutRequest::default())];
        no_key(rejected(txn_command(txn.into())));
    }

    #[test]
    fn oversized_put_is_rejected_with_etcds_error() {
        let at_limit = pb::PutRequest { key: key("k"), value: vec![0; MAX_REQUEST_BYTES - 16], ..Default::default() };
        assert!(at_limit.encoded_len() <= MAX_REQUEST_BYTES);
        assert!(put_command(at_limit).is_ok());
        let over = pb::PutRequest { key: key("k"), value: vec![0; MAX_REQUEST_BYTES], ..Default::default() };
        let status = rejected(put_command(over));
        assert_eq!((status.code(), status.message()), (Code::InvalidArgument, "etcdserver: request is too large"));
    }

    #[test]
    fn txn_op_budget_counts_nested_txns() {
        let put = || Op::Put(PutRequest { key: key("k"), ..Default::default() });
        let txn_of = |n: usize| Txn { success: (0..n).map(|_| put()).collect(), ..Default::default() };
        assert!(txn_command(txn_of(MAX_TXN_OPS).into()).is_ok());
        let status = rejected(txn_command(txn_of(MAX_TXN_OPS + 1).into()));
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, "etcdserver: too many operations in txn request")
        );
        // 100 ops outside leave 28 for the nested txn.
        let with_nested = |n: usize| {
            let mut outer = txn_of(99);
            outer.success.push(Op::Txn(txn_of(n)));
            outer
        };
        assert!(txn_command(with_nested(28).into()).is_ok());
        assert!(txn_command(with_nested(29).into()).is_err());
    }

    #[test]
    fn put_flags_follow_etcds_rules() {
        let ignore_value = pb::PutRequest { key: key("k"), value: key("v"), ignore_value: true, ..Default::default() };
        assert_eq!(put_command(ignore_value), Err(RequestError::ValueProvided));
        let ignore_lease = pb::PutRequest { key: key("k"), lease: 3, ignore_lease: true, ..Default::default() };
        assert_eq!(put_command(ignore_lease), Err(RequestError::LeaseProvided));
        let empty_op = pb::TxnRequest { success: vec![pb::RequestOp { request: None }], ..Default::default() };
        assert_eq!(txn_command(empty_op), Err(RequestError::EmptyOp));
    }
}
