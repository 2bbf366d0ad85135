//! Deterministic collectives (issue 17) on the local backend: property tests against the
//! canonical summation tree computed serially, for the local backend's own all-reduce and for
//! the provided (all-to-all-v + all-gather-v) algorithm that the MPI backend runs.

use std::time::Duration;

use comm::{Buf, BufMut, CommError, Communicator, CommunicatorExt, LocalCluster, ReduceOp, Tag};
use proptest::prelude::*;
use tensor::kernels::tree::tree_reduce;
use tensor::Tensor;

/// Forwards the required methods only, so every provided method runs its generic algorithm:
/// the local backend's override of `all_reduce_deterministic_buf` is bypassed.
#[derive(Debug)]
struct ProvidedOnly<'a>(&'a dyn Communicator);

impl Communicator for ProvidedOnly<'_> {
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn label(&self) -> &str {
        self.0.label()
    }
    fn timeout(&self) -> Duration {
        self.0.timeout()
    }
    fn group(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        self.0.group(ranks)
    }
    fn barrier(&self) -> Result<(), CommError> {
        self.0.barrier()
    }
    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<(), CommError> {
        self.0.broadcast_bytes(buf, root)
    }
    fn all_reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        self.0.all_reduce_buf(buf, op)
    }
    fn reduce_scatter_v(
        &self,
        send: Buf<'_>,
        recv: BufMut<'_>,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.0.reduce_scatter_v(send, recv, counts, op)
    }
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        self.0.all_gather_bytes(send, recv)
    }
    fn all_gather_v_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
    ) -> Result<(), CommError> {
        self.0.all_gather_v_bytes(send, recv, counts)
    }
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        self.0.all_to_all_bytes(send, recv)
    }
    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        self.0
            .all_to_all_v_bytes(send, send_counts, recv, recv_counts)
    }
    fn send_bytes(&self, dst: usize, tag: Tag, data: &[u8]) -> Result<(), CommError> {
        self.0.send_bytes(dst, tag, data)
    }
    fn recv_bytes(&self, src: usize, tag: Tag) -> Result<Vec<u8>, CommError> {
        self.0.recv_bytes(src, tag)
    }
}

/// The serial reference: element `i` is `tree_reduce` over `members` (in that order) of their
/// inputs' element `i`.
fn serial_tree(inputs: &[Vec<f32>], members: &[usize]) -> Vec<f32> {
    let len = inputs[members[0]].len();
    (0..len)
        .map(|i| {
            tree_reduce(
                members.len(),
                &mut |p| inputs[members[p]][i],
                &mut |a, b| a + b,
            )
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// What one rank saw: its all-reduce results (local override, provided algorithm) and its
/// reduce-scatter part.
struct Seen {
    local: Vec<f32>,
    provided: Vec<f32>,
    part: Vec<f32>,
}

/// Runs the deterministic all-reduce (both algorithms) and reduce-scatter of `input` on `comm`,
/// with a rank-dependent delay first so the ranks arrive in varying orders.
fn reduce_on(comm: &dyn Communicator, input: &[f32], delay_us: u64) -> Result<Seen, CommError> {
    std::thread::sleep(Duration::from_micros(delay_us));
    let mut local = input.to_vec();
    comm.all_reduce_deterministic_in_place(&mut local, ReduceOp::Sum)?;
    let mut provided = Tensor::from_vec(&[input.len()], input.to_vec()).expect("1-d");
    ProvidedOnly(comm).all_reduce_deterministic(&mut provided, ReduceOp::Sum)?;
    let part = comm.reduce_scatter_deterministic(
        &Tensor::from_vec(&[input.len()], input.to_vec()).expect("1-d"),
        ReduceOp::Sum,
    )?;
    Ok(Seen {
        local,
        provided: provided.as_f32().expect("f32").to_vec(),
        part: part.as_f32().expect("f32").to_vec(),
    })
}

/// Checks one member's results against the serial tree over `members`' inputs.
fn check(seen: &Seen, member: usize, members: &[usize], inputs: &[Vec<f32>]) {
    let want = serial_tree(inputs, members);
    assert_eq!(
        bits(&seen.local),
        bits(&want),
        "local all-reduce, member {member}"
    );
    assert_eq!(
        bits(&seen.provided),
        bits(&want),
        "provided all-reduce, member {member}"
    );
    let counts = comm::split_counts(want.len(), members.len());
    let start: usize = counts[..member].iter().sum();
    assert_eq!(
        bits(&seen.part),
        bits(&want[start..start + counts[member]]),
        "reduce-scatter part of member {member}"
    );
}

/// `n` inputs of `len` f32 values `m · 2^e` with `|m| < 1` and `e` in -40..40: sums round,
/// and most orders of addition give other bits.
fn inputs(sizes: &'static [usize]) -> impl Strategy<Value = Vec<Vec<f32>>> {
    (prop::sample::select(sizes), 0usize..300).prop_flat_map(|(n, len)| {
        prop::collection::vec(
            prop::collection::vec(
                (-1.0f32..1.0, -40i32..40).prop_map(|(m, e)| m * 2f32.powi(e)),
                len,
            ),
            n,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every rank of the world gets bitwise `tree_reduce` over the ranks' inputs, whatever the
    /// arrival order; each gets its chunk of it from the reduce-scatter.
    #[test]
    fn world_results_are_the_serial_tree(
        inputs in inputs(&[1, 2, 3, 4, 8]),
        delays in prop::collection::vec(0u64..300, 8),
    ) {
        let n = inputs.len();
        let results = LocalCluster::new(n)
            .expect("n > 0")
            .run(|comm| reduce_on(&comm, &inputs[comm.rank()], delays[comm.rank()]));
        let members: Vec<usize> = (0..n).collect();
        for (rank, r) in results.into_iter().enumerate() {
            check(&r.expect("no panic").expect("no comm error"), rank, &members, &inputs);
        }
    }

    /// On a sub-group built from a permuted rank list, member order is the group's order: the
    /// tree runs over the members as listed, not in world-rank order. Ranks outside the group
    /// do not take part.
    #[test]
    fn subgroups_reduce_in_the_order_they_list_their_members(
        inputs in inputs(&[8]),
        order in Just((0..8usize).collect::<Vec<_>>()).prop_shuffle(),
        n_members in 1usize..=8,
        delays in prop::collection::vec(0u64..300, 8),
    ) {
        let members = &order[..n_members];
        let results = LocalCluster::new(8).expect("8 ranks").run(|comm| {
            let Some(member) = members.iter().position(|&r| r == comm.rank()) else {
                return Ok(None);
            };
            let group = comm.group(members)?;
            assert_eq!(group.rank(), member);
            reduce_on(group.as_ref(), &inputs[comm.rank()], delays[comm.rank()])
                .map(|seen| Some((member, seen)))
        });
        for r in results {
            if let Some((member, seen)) = r.expect("no panic").expect("no comm error") {
                check(&seen, member, members, &inputs);
            }
        }
    }
}

/// The tree over members differs from the rank-order fold that `all_reduce` uses, so these
/// tests would catch a deterministic all-reduce that fell back to it: find inputs where they
/// differ and check that the deterministic result follows the tree.
#[test]
fn the_tree_is_not_the_rank_order_fold() {
    let inputs: Vec<Vec<f32>> = vec![vec![1.0e8], vec![1.0], vec![-1.0e8], vec![1.0]];
    let fold = ((1.0e8f32 + 1.0) + -1.0e8) + 1.0;
    let tree = (1.0e8f32 + 1.0) + (-1.0e8 + 1.0);
    assert_ne!(fold.to_bits(), tree.to_bits());
    let results = LocalCluster::new(4).unwrap().run(|comm| {
        let mut x = inputs[comm.rank()].clone();
        comm.all_reduce_deterministic_in_place(&mut x, ReduceOp::Sum)?;
        let mut y = inputs[comm.rank()].clone();
        ProvidedOnly(&comm).all_reduce_deterministic_in_place(&mut y, ReduceOp::Sum)?;
        Ok::<_, CommError>((x[0], y[0]))
    });
    for r in results {
        let (local, provided) = r.unwrap().unwrap();
        assert_eq!(local.to_bits(), tree.to_bits());
        assert_eq!(provided.to_bits(), tree.to_bits());
    }
}

/// Mean divides the tree's sum by the member count; max and min follow the same path; f64 and
/// f16 work; both algorithms agree.
#[test]
fn every_op_and_float_dtype_follows_the_tree() {
    let n = 3;
    let value =
        |r: usize, i: usize| 1.0 / (1.0 + r as f64 * 3.7 + i as f64) * 10f64.powi(i as i32 % 9 - 4);
    let results = LocalCluster::new(n).unwrap().run(|comm| {
        let mut seen = Vec::new();
        for dtype in [tensor::DType::F64, tensor::DType::F32, tensor::DType::F16] {
            for op in ReduceOp::ALL {
                let t = Tensor::from_vec(
                    &[50],
                    (0..50).map(|i| value(comm.rank(), i)).collect::<Vec<_>>(),
                )
                .unwrap()
                .to_dtype(dtype);
                let mut a = t.clone();
                comm.all_reduce_deterministic(&mut a, op)?;
                let mut b = t.clone();
                ProvidedOnly(&comm).all_reduce_deterministic(&mut b, op)?;
                seen.push((dtype, op, a, b));
            }
        }
        Ok::<_, CommError>(seen)
    });
    for r in results {
        for (dtype, op, a, b) in r.unwrap().unwrap() {
            assert_eq!(
                a.as_bytes(),
                b.as_bytes(),
                "{dtype} {op}: the two algorithms differ"
            );
            let got = a.to_f64_vec();
            for (i, g) in got.iter().enumerate() {
                let x = |p: usize| {
                    Tensor::from_vec(&[1], vec![value(p, i)])
                        .unwrap()
                        .to_dtype(dtype)
                        .to_f64_vec()[0]
                };
                let want = match (dtype, op) {
                    (tensor::DType::F64, ReduceOp::Sum) => {
                        tree_reduce(n, &mut |p| x(p), &mut |a, b| a + b)
                    }
                    (tensor::DType::F64, ReduceOp::Mean) => {
                        tree_reduce(n, &mut |p| x(p), &mut |a, b| a + b) / n as f64
                    }
                    (_, ReduceOp::Max) => (0..n).map(x).fold(f64::NEG_INFINITY, f64::max),
                    (_, ReduceOp::Min) => (0..n).map(x).fold(f64::INFINITY, f64::min),
                    (_, op) => {
                        // f32 accumulation (f16 rounds once at the end).
                        let s = tree_reduce(n, &mut |p| x(p) as f32, &mut |a, b| a + b);
                        let s = if op == ReduceOp::Mean {
                            s / n as f32
                        } else {
                            s
                        };
                        Tensor::from_vec(&[1], vec![s])
                            .unwrap()
                            .to_dtype(dtype)
                            .to_f64_vec()[0]
                    }
                };
                assert_eq!(g.to_bits(), want.to_bits(), "{dtype} {op} element {i}");
            }
        }
    }
}

/// Ranks that mix the ordinary and the deterministic all-reduce are told so (local backend),
/// instead of pairing two different reductions.
#[test]
fn mixing_deterministic_and_ordinary_all_reduce_is_a_mismatch() {
    let results = LocalCluster::new(2)
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .run(|comm| {
            let mut x = vec![1f32; 64];
            if comm.rank() == 0 {
                comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
            } else {
                comm.all_reduce_deterministic_in_place(&mut x, ReduceOp::Sum)
            }
        });
    for r in results {
        let err = r.unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                CommError::Mismatch { .. } | CommError::PeerFailed { .. }
            ),
            "{err:?}"
        );
    }
}

/// Bad arguments name the call and poison nothing.
#[test]
fn bad_arguments_are_refused_before_communicating() {
    let results = LocalCluster::new(2).unwrap().run(|comm| {
        let mut flags = Tensor::from_bools(&[2], &[true, false]).unwrap();
        let sum_of_bools = comm.all_reduce_deterministic(&mut flags, ReduceOp::Sum);
        assert!(
            matches!(&sum_of_bools, Err(CommError::UnsupportedReduction { site, .. }) if site.op == "all_reduce_deterministic"),
            "{sum_of_bools:?}"
        );
        let provided = ProvidedOnly(&comm).all_reduce_deterministic(&mut flags, ReduceOp::Mean);
        assert!(
            matches!(provided, Err(CommError::UnsupportedReduction { .. })),
            "{provided:?}"
        );
        let mut out = [0f32; 1];
        let bad_counts = comm.reduce_scatter_deterministic_v(
            Buf::new(&[0f32; 3]),
            BufMut::new(&mut out),
            &[1, 1],
            ReduceOp::Sum,
        );
        assert!(
            matches!(&bad_counts, Err(CommError::InvalidArgument { site, reason }) if site.op == "reduce_scatter_deterministic" && reason.contains("counts")),
            "{bad_counts:?}"
        );
        let scalar = comm.reduce_scatter_deterministic(&Tensor::scalar(1f32), ReduceOp::Sum);
        assert!(matches!(scalar, Err(CommError::InvalidArgument { .. })), "{scalar:?}");
        // Still usable: bool max is a logical or.
        comm.all_reduce_deterministic(&mut flags, ReduceOp::Max)?;
        Ok::<_, CommError>(flags.to_f64_vec())
    });
    for r in results {
        assert_eq!(r.unwrap().unwrap(), vec![1.0, 0.0]);
    }
}
