//! A server's row-sparse requests, checked against its blocks of the server-resident tables
//! (`ps.embedding_on_server`): the rows a pull asks for, a push's row-sparse gradients, and
//! their mean over a sync step's pushes.

use std::collections::BTreeMap;

use super::{Pushed, State};
use crate::error::PsError;
use crate::proto::RowsMsg;
use crate::sparse::{check_ids, from_rows_msg, mean_rows, to_rows_msg, Rows};
use crate::table::ServerTable;

/// The table of `msg` among the server's tables.
fn table_of<'a>(s: &'a State, name: &str) -> Result<&'a ServerTable, PsError> {
    s.tables
        .iter()
        .find(|t| t.info().name == name)
        .ok_or_else(|| {
            PsError::message(
                "pull",
                format!(
                    "server {} holds no server-resident table {name:?}",
                    s.server_id
                ),
            )
        })
}

/// Checks a pull's row requests: held tables, each asked for once (a table named again would
/// make the reply repeat its rows, as many times as the request can name it), ids in the table
/// and this server's block.
pub(super) fn sparse_request_ok(s: &State, wanted: &[RowsMsg]) -> Result<(), PsError> {
    let mut named = std::collections::BTreeSet::new();
    for msg in wanted {
        let table = table_of(s, &msg.name)?;
        if !named.insert(msg.name.as_str()) {
            return Err(PsError::rows(
                &msg.name,
                "asked for twice in one pull (name each table once, with every row id wanted)",
            ));
        }
        check_ids(msg, table.info(), table.block())?;
    }
    Ok(())
}

/// The rows a pull asks for (checked by [`sparse_request_ok`]).
pub(super) fn sparse_rows(s: &State, wanted: &[RowsMsg]) -> Result<Vec<RowsMsg>, PsError> {
    wanted
        .iter()
        .map(|msg| {
            let table = table_of(s, &msg.name)?;
            Ok(to_rows_msg(table.info(), &table.rows(&msg.ids)?))
        })
        .collect()
}

/// A push's row-sparse gradients, one per table in the server's order (empty rows for a table
/// the push leaves out); each message checked against its table before it is decoded.
pub(super) fn sparse_grads(s: &State, msgs: &[RowsMsg]) -> Result<Vec<Rows>, PsError> {
    let mut out: Vec<Option<Rows>> = vec![None; s.tables.len()];
    for msg in msgs {
        let t = s
            .tables
            .iter()
            .position(|t| t.info().name == msg.name)
            .ok_or_else(|| {
                PsError::message(
                    "push",
                    format!(
                        "server {} holds no server-resident table {:?}",
                        s.server_id, msg.name
                    ),
                )
            })?;
        if out[t].is_some() {
            return Err(PsError::message(
                "push",
                format!("table {} sent twice", msg.name),
            ));
        }
        out[t] = Some(from_rows_msg(msg, s.tables[t].info(), s.tables[t].block())?);
    }
    Ok(out
        .into_iter()
        .map(|r| {
            r.unwrap_or(Rows {
                ids: Vec::new(),
                values: Vec::new(),
            })
        })
        .collect())
}

/// The row-sparse counterpart of [`super::mean_of`] for every table: the same weights, order of
/// additions and scale, on the rows the pushes have.
pub(super) fn sparse_mean_of(pushed: &BTreeMap<u32, Pushed>, tables: &[ServerTable]) -> Vec<Rows> {
    let total_rows: u64 = pushed.values().map(|p| p.rows).sum();
    let equal = pushed
        .values()
        .all(|p| Some(p.rows) == pushed.values().next().map(|q| q.rows));
    let denominator = if equal {
        pushed.len() as f64
    } else {
        total_rows.max(1) as f64
    };
    let weights: Option<Vec<f32>> =
        (!equal).then(|| pushed.values().map(|p| p.rows as f64 as f32).collect());
    let scale = 1.0 / denominator as f32;
    tables
        .iter()
        .enumerate()
        .map(|(t, table)| {
            let pushes: Vec<&Rows> = pushed.values().filter_map(|p| p.sparse.get(t)).collect();
            mean_rows(&pushes, table.info().width, weights.as_deref(), scale)
        })
        .collect()
}
