//! `Concat` and `Split` on a rank's threads: large joins and cuts go out in runs of whole outer
//! blocks, one per thread; the result is the one thread's, element for element.

use graph::{eval_op, EvalCtx, Op};
use tensor::kernels::threads::set_threads;
use tensor::Tensor;

use crate::util::uniform;

fn ctx() -> EvalCtx<'static> {
    EvalCtx {
        node: "pieces",
        step: 0,
        placement: None,
        input_blocks: &[],
        deterministic: None,
    }
}

/// `op` on `inputs` into zeroed outputs of `shapes`, on `threads` threads; the outputs' bits.
fn run(op: &Op, inputs: &[Tensor], shapes: &[Vec<usize>], threads: usize) -> Vec<Vec<u32>> {
    let mut outputs: Vec<Tensor> = shapes
        .iter()
        .map(|s| Tensor::zeros(tensor::DType::F32, s))
        .collect();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    set_threads(threads);
    let result = eval_op(op, &refs, &mut outputs, &ctx());
    set_threads(1);
    result.expect("a valid join or cut");
    let bits = |t: &Tensor| {
        t.as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    outputs.iter().map(bits).collect()
}

#[test]
fn joins_and_cuts_are_the_same_on_any_thread_count_and_undo_each_other() {
    let _threads = crate::util::kernel_threads_lock();
    // The GPT's q|k|v cut of `[B, S, heads, 3·head_dim]` and its gradients' join, a ragged outer
    // count, and pieces of different sizes (one empty).
    let cases: [(&[usize], usize, &[usize]); 3] = [
        (&[16, 128, 4, 192], 3, &[64, 64, 64]),
        (&[37, 301], 1, &[100, 0, 201]),
        (&[9, 40, 33], 1, &[7, 33]),
    ];
    for (shape, axis, sizes) in cases {
        let x = uniform(shape, 3).to_dtype(tensor::DType::F32);
        let pieces: Vec<Vec<usize>> = sizes
            .iter()
            .map(|&s| {
                let mut p = shape.to_vec();
                p[axis] = s;
                p
            })
            .collect();
        let split = Op::Split {
            axis,
            sizes: sizes.to_vec(),
        };
        let cut = run(&split, std::slice::from_ref(&x), &pieces, 1);
        for threads in [2, 3] {
            assert_eq!(run(&split, std::slice::from_ref(&x), &pieces, threads), cut);
        }
        let parts: Vec<Tensor> = cut
            .iter()
            .zip(&pieces)
            .map(|(bits, s)| {
                let values: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
                Tensor::from_vec(s, values).unwrap()
            })
            .collect();
        let concat = Op::Concat {
            axis,
            n: sizes.len(),
        };
        let whole: Vec<u32> = x
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        for threads in [1, 2, 3] {
            let joined = run(&concat, &parts, &[shape.to_vec()], threads);
            assert_eq!(
                joined,
                vec![whole.clone()],
                "{shape:?} on {threads} threads"
            );
        }
    }
}
