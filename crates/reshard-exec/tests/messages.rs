//! Reshards between disjoint rank sets sent as tagged messages: the senders go on without
//! waiting, and the receivers get every plan's values in the order the plans were sent.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use layout::{Layout, Mesh, MeshAxis, TensorLayout};
use reshard_exec::{DistTensor, ReshardRunner};
use tensor::{DType, Tensor};

/// A 2 × 2 mesh (axes `a`, `b`) over `ranks`.
fn mesh(ranks: Vec<usize>) -> Mesh {
    let axis = |name: &str| MeshAxis {
        name: name.into(),
        size: 2,
    };
    Mesh::from_axes(vec![axis("a"), axis("b")], Some(ranks)).unwrap()
}

fn layout(ranks: Vec<usize>, dims: Vec<Vec<usize>>, shape: &[usize]) -> TensorLayout {
    Layout::from_mesh(mesh(ranks), dims)
        .unwrap()
        .bind(shape)
        .unwrap()
}

#[test]
fn senders_do_not_wait_and_receivers_get_each_plan_in_order() {
    let shape = [8, 6];
    // Stage 0 (ranks 0..4) holds the tensor split by rows over a×b; stage 1 (ranks 4..8) wants
    // it split by rows over a and by columns over b.
    let src = layout((0..4).collect(), vec![vec![0, 1], Vec::new()], &shape);
    let dst = layout((4..8).collect(), vec![vec![0], vec![1]], &shape);
    let plan = Arc::new(reshard::plan(&src, &dst, DType::F32).unwrap());
    let globals: Vec<Tensor> = (0..3)
        .map(|k| Tensor::from_vec(&shape, (0..48).map(|i| (i + 100 * k) as f32).collect()).unwrap())
        .collect();
    let results = LocalCluster::new(8).unwrap().run({
        let (plan, src, dst, globals) = (plan.clone(), src.clone(), dst.clone(), globals.clone());
        move |comm| -> Vec<Tensor> {
            let rank = comm.rank();
            let mut runner = ReshardRunner::new(Arc::new(comm));
            let mut got = Vec::new();
            if rank < 4 {
                // Three plans sent back to back: no receiver has called yet.
                for g in &globals {
                    let local = DistTensor::from_global(g, &src, rank).unwrap().into_local();
                    let refs: Vec<&Tensor> = local.iter().collect();
                    runner.run_into_messages(&plan, &refs, &mut [], 7).unwrap();
                }
            } else {
                std::thread::sleep(std::time::Duration::from_millis(50));
                for _ in &globals {
                    let shape = dst.slice_shape().to_vec();
                    let mut out = vec![Tensor::zeros(DType::F32, &shape)];
                    runner.run_into_messages(&plan, &[], &mut out, 7).unwrap();
                    got.push(out.pop().unwrap());
                }
            }
            got
        }
    });
    for (rank, r) in results.into_iter().enumerate().skip(4) {
        let got = r.unwrap();
        for (k, t) in got.iter().enumerate() {
            let want = globals[k]
                .extract_box(&dst.rank_box(rank).unwrap())
                .unwrap();
            assert_eq!(t, &want, "rank {rank}, plan {k}");
        }
    }
}
