//! Row-sparse tensors of server-resident embedding tables (`ps.embedding_on_server`): which
//! server holds which rows, the row messages of pulls and pushes (checked against the table
//! before anything is allocated from their sizes), and the mean of several workers' row-sparse
//! gradients.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::error::PsError;
use crate::proto::RowsMsg;

/// A server-resident table: its name, rows and row width (f32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// The parameter's name (`embedding.embedding_table`).
    pub name: String,
    /// Rows of the whole table (the vocabulary).
    pub rows: usize,
    /// Values per row (the embedding size).
    pub width: usize,
}

impl TableInfo {
    /// Bytes of the whole table.
    pub fn bytes(&self) -> usize {
        self.rows * self.width * 4
    }

    /// The rows server `server_id` of `servers` holds: the table cut into `servers` contiguous
    /// blocks of (nearly) equal rows, in server order.
    pub fn block(&self, servers: usize, server_id: usize) -> Range<usize> {
        let s = servers.max(1);
        let start = self.rows * server_id / s;
        let end = self.rows * (server_id + 1) / s;
        start..end
    }

    /// The server holding row `id`.
    pub fn owner(&self, servers: usize, id: usize) -> usize {
        (0..servers.max(1))
            .find(|&s| self.block(servers, s).contains(&id))
            .unwrap_or(0)
    }
}

/// Rows of one table: distinct global ids and `ids.len() × width` values, row after row.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    /// Global row ids, distinct.
    pub ids: Vec<u64>,
    /// The values, row after row.
    pub values: Vec<f32>,
}

impl Rows {
    /// Bytes of the values.
    pub fn bytes(&self) -> usize {
        self.values.len() * 4
    }
}

/// `rows` of table `table` as a message.
pub fn to_rows_msg(table: &TableInfo, rows: &Rows) -> RowsMsg {
    RowsMsg {
        name: table.name.clone(),
        ids: rows.ids.clone(),
        width: table.width as u64,
        data: rows.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// A pull's request for rows `ids` of `table` (no values).
pub fn request_msg(table: &TableInfo, ids: &[u64]) -> RowsMsg {
    RowsMsg {
        name: table.name.clone(),
        ids: ids.to_vec(),
        width: table.width as u64,
        data: Vec::new(),
    }
}

/// Checks the ids of `msg` against `table` and the block `held`: distinct, at most the block's
/// rows, each inside the table and the block. Errors name the table and the id.
pub fn check_ids(msg: &RowsMsg, table: &TableInfo, held: &Range<usize>) -> Result<(), PsError> {
    if msg.name != table.name {
        return Err(PsError::rows(
            &table.name,
            format!("the message holds rows of table {:?} instead", msg.name),
        ));
    }
    if msg.ids.len() > held.len() {
        return Err(PsError::rows(
            &table.name,
            format!(
                "{} row ids, more than the {} rows this server holds",
                msg.ids.len(),
                held.len()
            ),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for &id in &msg.ids {
        if id >= table.rows as u64 {
            return Err(PsError::rows(
                &table.name,
                format!(
                    "row id {id} is out of range (the table has {} rows)",
                    table.rows
                ),
            ));
        }
        if !held.contains(&(id as usize)) {
            return Err(PsError::rows(
                &table.name,
                format!(
                    "row id {id} is not held here (this server holds rows {}..{})",
                    held.start, held.end
                ),
            ));
        }
        if !seen.insert(id) {
            return Err(PsError::rows(
                &table.name,
                format!("row id {id} appears twice"),
            ));
        }
    }
    Ok(())
}

/// The rows of `msg`, which must be rows of `table` inside `held` (see [`check_ids`]) of width
/// `table.width` with exactly `ids × width × 4` bytes: checked before the values are
/// allocated.
pub fn from_rows_msg(
    msg: &RowsMsg,
    table: &TableInfo,
    held: &Range<usize>,
) -> Result<Rows, PsError> {
    check_ids(msg, table, held)?;
    if msg.width != table.width as u64 {
        return Err(PsError::rows(
            &table.name,
            format!("rows of width {}, expected {}", msg.width, table.width),
        ));
    }
    let want = msg.ids.len() * table.width * 4;
    if msg.data.len() != want {
        return Err(PsError::rows(
            &table.name,
            format!(
                "{} bytes for {} rows, expected {want} ({} f32 per row)",
                msg.data.len(),
                msg.ids.len(),
                table.width
            ),
        ));
    }
    let values = msg
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(Rows {
        ids: msg.ids.clone(),
        values,
    })
}

/// The weighted mean of several workers' row-sparse gradients of one table, as the dense
/// mean of the same gradients computes it for their rows: every row starts at 0, the pushes
/// are added in worker order (`weights[k]` times push k's row, or the row itself when
/// `weights` is `None`), and the sum is multiplied by `scale`. Rows no push has are absent
/// (their dense mean is 0). The rows come out in id order.
pub fn mean_rows(pushes: &[&Rows], width: usize, weights: Option<&[f32]>, scale: f32) -> Rows {
    let mut sums: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
    for (k, push) in pushes.iter().enumerate() {
        for (j, &id) in push.ids.iter().enumerate() {
            let row = &push.values[j * width..(j + 1) * width];
            let sum = sums.entry(id).or_insert_with(|| vec![0f32; width]);
            match weights {
                Some(w) => sum.iter_mut().zip(row).for_each(|(s, x)| *s += w[k] * x),
                None => sum.iter_mut().zip(row).for_each(|(s, x)| *s += x),
            }
        }
    }
    let mut out = Rows {
        ids: Vec::with_capacity(sums.len()),
        values: Vec::with_capacity(sums.len() * width),
    };
    for (id, mut sum) in sums {
        sum.iter_mut().for_each(|s| *s *= scale);
        out.ids.push(id);
        out.values.extend(sum);
    }
    out
}

/// `rows` of `table` cut by owner: one (possibly empty) [`Rows`] per server, ids in order.
pub fn split_rows(table: &TableInfo, servers: usize, rows: &Rows) -> Vec<Rows> {
    let w = table.width;
    let mut out: Vec<Rows> = (0..servers.max(1))
        .map(|_| Rows {
            ids: Vec::new(),
            values: Vec::new(),
        })
        .collect();
    for (k, &id) in rows.ids.iter().enumerate() {
        let s = table.owner(servers, id as usize);
        out[s].ids.push(id);
        out[s]
            .values
            .extend_from_slice(&rows.values[k * w..(k + 1) * w]);
    }
    out
}

/// A worker's rows of one server-resident table for one step: the batch's distinct ids and
/// their values, filled in from the servers' pull replies.
#[derive(Debug, Clone, PartialEq)]
pub struct PulledRows {
    /// The table (`None`: the job has no server-resident table).
    pub table: Option<TableInfo>,
    /// The distinct ids, in order.
    pub ids: Vec<u64>,
    /// `ids.len() × width` values.
    pub values: Vec<f32>,
}

impl PulledRows {
    /// No rows (a job without server-resident tables, or a pull of the dense weights only).
    pub fn none() -> PulledRows {
        PulledRows {
            table: None,
            ids: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Room for rows `ids` (distinct, in order) of `table`.
    pub fn new(table: &TableInfo, ids: Vec<u64>) -> PulledRows {
        let values = vec![0f32; ids.len() * table.width];
        PulledRows {
            table: Some(table.clone()),
            ids,
            values,
        }
    }

    /// Bytes of the values: what the worker holds of the table.
    pub fn bytes(&self) -> usize {
        self.values.len() * 4
    }

    /// The request to server `s` of `servers`: the ids it holds (none when it holds none).
    pub fn request_for(&self, servers: usize, s: usize) -> Vec<RowsMsg> {
        let Some(table) = &self.table else {
            return Vec::new();
        };
        let block = table.block(servers, s);
        let ids: Vec<u64> = self
            .ids
            .iter()
            .copied()
            .filter(|&id| block.contains(&(id as usize)))
            .collect();
        match ids.is_empty() {
            true => Vec::new(),
            false => vec![request_msg(table, &ids)],
        }
    }

    /// Writes server `s`'s reply rows in; they must be exactly the rows asked of it.
    pub fn fill(&mut self, servers: usize, s: usize, reply: &[RowsMsg]) -> Result<(), PsError> {
        let asked = self.request_for(servers, s);
        let Some(table) = &self.table else {
            return match reply.is_empty() {
                true => Ok(()),
                false => Err(PsError::message(
                    format!("Pull reply of server {s}"),
                    "rows nobody asked for (the job has no server-resident table)",
                )),
            };
        };
        let asked_ids: &[u64] = asked.first().map_or(&[], |m| m.ids.as_slice());
        let got: Vec<Rows> = reply
            .iter()
            .map(|m| from_rows_msg(m, table, &table.block(servers, s)))
            .collect::<Result<_, _>>()?;
        let got_ids: Vec<u64> = got.iter().flat_map(|r| r.ids.iter().copied()).collect();
        if got_ids != asked_ids {
            return Err(PsError::rows(
                &table.name,
                format!(
                    "server {s} sent {} rows, {} were asked",
                    got_ids.len(),
                    asked_ids.len()
                ),
            ));
        }
        let w = table.width;
        for rows in &got {
            for (k, id) in rows.ids.iter().enumerate() {
                let at = self.ids.binary_search(id).map_err(|_| {
                    PsError::rows(
                        &table.name,
                        format!("server {s} sent row {id}, which was not asked"),
                    )
                })?;
                self.values[at * w..(at + 1) * w].copy_from_slice(&rows.values[k * w..(k + 1) * w]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> TableInfo {
        TableInfo {
            name: "t".to_string(),
            rows: 10,
            width: 2,
        }
    }

    #[test]
    fn blocks_cover_the_table_once() {
        let t = table();
        let blocks: Vec<_> = (0..3).map(|s| t.block(3, s)).collect();
        assert_eq!(blocks, vec![0..3, 3..6, 6..10]);
        assert_eq!(t.owner(3, 5), 1);
        assert_eq!(t.owner(3, 9), 2);
    }

    #[test]
    fn messages_round_trip_and_bad_ones_are_named() {
        let t = table();
        let rows = Rows {
            ids: vec![7, 2],
            values: vec![1.0, 2.0, 3.0, 4.0],
        };
        let msg = to_rows_msg(&t, &rows);
        assert_eq!(from_rows_msg(&msg, &t, &(0..10)).unwrap(), rows);
        let err =
            |m: &RowsMsg, held: Range<usize>| from_rows_msg(m, &t, &held).unwrap_err().to_string();
        let mut far = msg.clone();
        far.ids[0] = 10;
        assert!(err(&far, 0..10).contains("table t: row id 10 is out of range"));
        assert!(err(&msg, 0..5).contains("row id 7 is not held here"));
        let mut twice = msg.clone();
        twice.ids[1] = 7;
        assert!(err(&twice, 0..10).contains("appears twice"));
        let mut wide = msg.clone();
        wide.width = 3;
        assert!(err(&wide, 0..10).contains("width 3, expected 2"));
        let mut short = msg.clone();
        short.data.pop();
        assert!(err(&short, 0..10).contains("15 bytes for 2 rows"));
    }

    #[test]
    fn the_mean_of_rows_is_the_dense_mean_on_them() {
        let a = Rows {
            ids: vec![1, 3],
            values: vec![1.0, 2.0, 3.0, 4.0],
        };
        let b = Rows {
            ids: vec![3],
            values: vec![10.0, 20.0],
        };
        let m = mean_rows(&[&a, &b], 2, None, 0.5);
        assert_eq!(m.ids, vec![1, 3]);
        assert_eq!(m.values, vec![0.5, 1.0, 6.5, 12.0]);
        let w = mean_rows(&[&a, &b], 2, Some(&[1.0, 3.0]), 0.25);
        assert_eq!(w.values, vec![0.25, 0.5, 8.25, 16.0]);
    }
}
