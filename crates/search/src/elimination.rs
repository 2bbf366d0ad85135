//! Dynamic programming by graph elimination (MindSpore's op/edge/merge/contract elimination,
//! on the undirected view of the graph): a node with one neighbour is folded into it, a node
//! with two becomes an edge between them, parallel edges are summed. Each step records, for
//! every choice of the nodes that remain, the best choice of the node removed, so the optimum
//! is recovered by replaying the steps backwards. Exact when the graph reduces this way
//! (series-parallel graphs: chains, residual blocks, attention's diamonds); otherwise, or past
//! the deadline, the remaining nodes are fixed greedily and the result is marked approximate.

use std::time::Instant;

use crate::problem::SearchProblem;

/// An edge of the working graph: costs `m[a · n_v + b]` for `u` taking `a` and `v` taking `b`.
struct WorkEdge {
    u: usize,
    v: usize,
    m: Vec<f64>,
}

/// One elimination, replayed backwards to recover the choices.
enum Step {
    /// `w` has its choice fixed.
    Fixed { w: usize, choice: usize },
    /// `w` (one neighbour `x`) takes `arg[choice of x]`.
    Leaf { w: usize, x: usize, arg: Vec<u32> },
    /// `w` (neighbours `u`, `v`) takes `arg[choice of u · n_v + choice of v]`.
    Series {
        w: usize,
        u: usize,
        v: usize,
        arg: Vec<u32>,
    },
}

/// The outcome of one elimination run.
pub struct Solved {
    /// A candidate index per node.
    pub choice: Vec<usize>,
    /// Whether some node was fixed greedily (the result may not be optimal).
    pub approximate: bool,
}

struct Work {
    n_cands: Vec<usize>,
    cost: Vec<Vec<f64>>,
    alive: Vec<bool>,
    edges: Vec<Option<WorkEdge>>,
    adj: Vec<Vec<usize>>,
    history: Vec<Step>,
}

impl Work {
    fn live_edges(&self, w: usize) -> Vec<usize> {
        let mut out: Vec<usize> = self.adj[w]
            .iter()
            .copied()
            .filter(|&e| self.edges[e].is_some())
            .collect();
        out.dedup();
        out
    }

    /// The other end of edge `e` from `w`, and the cost for `w` taking `a`, the other `b`.
    fn other(&self, e: usize, w: usize) -> usize {
        let edge = self.edges[e].as_ref().expect("live edge");
        if edge.u == w {
            edge.v
        } else {
            edge.u
        }
    }

    fn at(&self, e: usize, w: usize, a: usize, b: usize) -> f64 {
        let edge = self.edges[e].as_ref().expect("live edge");
        if edge.u == w {
            edge.m[a * self.n_cands[edge.v] + b]
        } else {
            edge.m[b * self.n_cands[edge.v] + a]
        }
    }

    /// Adds an edge `u`–`v`, summing it into an existing one between them.
    fn add_edge(&mut self, u: usize, v: usize, m: Vec<f64>) {
        let existing = self
            .live_edges(u)
            .into_iter()
            .find(|&e| self.other(e, u) == v);
        match existing {
            Some(e) => {
                let nv = self.n_cands[v];
                let nu = self.n_cands[u];
                let edge = self.edges[e].as_mut().expect("live edge");
                if edge.u == u {
                    for (x, y) in edge.m.iter_mut().zip(&m) {
                        *x += y;
                    }
                } else {
                    for a in 0..nu {
                        for b in 0..nv {
                            edge.m[b * nu + a] += m[a * nv + b];
                        }
                    }
                }
            }
            None => {
                let e = self.edges.len();
                self.edges.push(Some(WorkEdge { u, v, m }));
                self.adj[u].push(e);
                self.adj[v].push(e);
            }
        }
    }

    fn remove(&mut self, w: usize, edges: &[usize]) {
        for &e in edges {
            self.edges[e] = None;
        }
        self.alive[w] = false;
    }

    fn eliminate_alone(&mut self, w: usize) {
        let choice = argmin(&self.cost[w]).0;
        self.history.push(Step::Fixed { w, choice });
        self.alive[w] = false;
    }

    fn eliminate_leaf(&mut self, w: usize, e: usize) {
        let x = self.other(e, w);
        let mut arg = Vec::with_capacity(self.n_cands[x]);
        for b in 0..self.n_cands[x] {
            let (best_a, best) = (0..self.n_cands[w])
                .map(|a| (a, self.cost[w][a] + self.at(e, w, a, b)))
                .fold(
                    (0, f64::INFINITY),
                    |acc, it| if it.1 < acc.1 { it } else { acc },
                );
            self.cost[x][b] += best;
            arg.push(best_a as u32);
        }
        self.remove(w, &[e]);
        self.history.push(Step::Leaf { w, x, arg });
    }

    fn eliminate_series(&mut self, w: usize, e1: usize, e2: usize) {
        let (u, v) = (self.other(e1, w), self.other(e2, w));
        let (nu, nv, nw) = (self.n_cands[u], self.n_cands[v], self.n_cands[w]);
        let mut m = vec![f64::INFINITY; nu * nv];
        let mut arg = vec![0u32; nu * nv];
        // Per w choice, its edge rows, so the inner loop reads contiguous memory.
        let left: Vec<Vec<f64>> = (0..nw)
            .map(|c| (0..nu).map(|a| self.at(e1, w, c, a)).collect())
            .collect();
        let right: Vec<Vec<f64>> = (0..nw)
            .map(|c| (0..nv).map(|b| self.at(e2, w, c, b)).collect())
            .collect();
        for c in 0..nw {
            let own = self.cost[w][c];
            for a in 0..nu {
                let base = own + left[c][a];
                let row = &mut m[a * nv..(a + 1) * nv];
                let args = &mut arg[a * nv..(a + 1) * nv];
                for b in 0..nv {
                    let total = base + right[c][b];
                    if total < row[b] {
                        row[b] = total;
                        args[b] = c as u32;
                    }
                }
            }
        }
        self.remove(w, &[e1, e2]);
        self.history.push(Step::Series { w, u, v, arg });
        self.add_edge(u, v, m);
    }

    fn eliminate_greedy(&mut self, w: usize, edges: &[usize]) {
        let score = |c: usize| -> f64 {
            self.cost[w][c]
                + edges
                    .iter()
                    .map(|&e| {
                        let x = self.other(e, w);
                        (0..self.n_cands[x])
                            .map(|b| self.at(e, w, c, b) + self.cost[x][b])
                            .fold(f64::INFINITY, f64::min)
                    })
                    .sum::<f64>()
        };
        let scores: Vec<f64> = (0..self.n_cands[w]).map(score).collect();
        let choice = argmin(&scores).0;
        for &e in edges {
            let x = self.other(e, w);
            for b in 0..self.n_cands[x] {
                let add = self.at(e, w, choice, b);
                self.cost[x][b] += add;
            }
        }
        self.remove(w, edges);
        self.history.push(Step::Fixed { w, choice });
    }
}

/// The index and value of the smallest entry.
fn argmin(values: &[f64]) -> (usize, f64) {
    values.iter().copied().enumerate().fold(
        (0, f64::INFINITY),
        |acc, it| if it.1 < acc.1 { it } else { acc },
    )
}

/// Minimises node time + `lambda` × node memory + edge time over `problem` by elimination,
/// fixing nodes greedily once `deadline` has passed.
pub fn solve(problem: &SearchProblem, lambda: f64, deadline: Option<Instant>) -> Solved {
    let n = problem.nodes.len();
    let n_cands: Vec<usize> = (0..n).map(|i| problem.n_candidates(i)).collect();
    let cost: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            (0..n_cands[i])
                .map(|c| problem.node_time(i, c) + lambda * problem.node_memory(i, c))
                .collect()
        })
        .collect();
    let mut work = Work {
        n_cands,
        cost,
        alive: vec![true; n],
        edges: Vec::new(),
        adj: vec![Vec::new(); n],
        history: Vec::new(),
    };
    for e in &problem.edges {
        work.add_edge(e.u, e.v, e.time.to_vec());
    }
    let mut approximate = false;
    let mut stack: Vec<usize> = (0..n).rev().collect();
    let mut remaining = n;
    while remaining > 0 {
        let Some(w) = stack.pop() else {
            // Every node left has three or more neighbours: fix the least connected greedily.
            let w = (0..n)
                .filter(|&w| work.alive[w])
                .min_by_key(|&w| work.live_edges(w).len())
                .expect("a node remains");
            let edges = work.live_edges(w);
            let neighbours: Vec<usize> = edges.iter().map(|&e| work.other(e, w)).collect();
            work.eliminate_greedy(w, &edges);
            approximate = true;
            remaining -= 1;
            stack.extend(neighbours);
            continue;
        };
        if !work.alive[w] {
            continue;
        }
        let edges = work.live_edges(w);
        let late = deadline.is_some_and(|d| Instant::now() > d);
        let neighbours: Vec<usize> = edges.iter().map(|&e| work.other(e, w)).collect();
        match edges.len() {
            0 => work.eliminate_alone(w),
            _ if late => {
                work.eliminate_greedy(w, &edges);
                approximate = true;
            }
            1 => work.eliminate_leaf(w, edges[0]),
            2 => work.eliminate_series(w, edges[0], edges[1]),
            _ => continue,
        }
        remaining -= 1;
        stack.extend(neighbours);
    }
    let mut choice = vec![0usize; n];
    for step in work.history.iter().rev() {
        match step {
            Step::Fixed { w, choice: c } => choice[*w] = *c,
            Step::Leaf { w, x, arg } => choice[*w] = arg[choice[*x]] as usize,
            Step::Series { w, u, v, arg } => {
                choice[*w] = arg[choice[*u] * work.n_cands[*v] + choice[*v]] as usize
            }
        }
    }
    Solved {
        choice,
        approximate,
    }
}
