//! FP8 on the CPU backend, the reference of the GPU's (whose ops are checked against these in
//! cuda_backend.rs): the encoding against the formats' definitions, the quantization against
//! its definition, the product against a sum in f64 of the operands' exact values.

use common::backend::cpu::CpuBackend;
use common::backend::{Act, Backend, DeviceBuffer, Fp8, Span};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

#[test]
fn the_encoding_rounds_to_nearest_even_and_saturates() {
    use Fp8::{E4M3, E5M2};
    for (format, x, bits) in [
        (E4M3, 1.0, 0x38),
        (E4M3, -2.0, 0xc0),
        (E4M3, 448.0, 0x7e),
        (E4M3, 1e6, 0x7e), // saturated to the largest finite value, not NaN
        (E4M3, -1e6, 0xfe),
        (E4M3, 1.0625, 0x38), // halfway between 1 and 1.125: to the even code
        (E4M3, 1.0626, 0x39),
        (E4M3, 2f32.powi(-9), 0x01),  // the smallest subnormal
        (E4M3, 2f32.powi(-10), 0x00), // half of it: to even, zero
        (E5M2, 1.0, 0x3c),
        (E5M2, 57344.0, 0x7b),
        (E5M2, 1e6, 0x7b),
        (E5M2, f32::INFINITY, 0x7b),
        (E5M2, 2f32.powi(-16), 0x01),
    ] {
        assert_eq!(format.encode(x), bits, "{format:?} {x}");
    }
    for format in [E4M3, E5M2] {
        for bits in 0..=255u8 {
            let v = format.decode(bits);
            if v.is_finite() {
                assert_eq!(format.encode(v), bits, "{format:?}: {bits:#04x} = {v} encodes back");
                assert!(v.abs() <= format.max(), "{format:?}: {bits:#04x} = {v}");
            }
        }
    }
}

/// `n` values uniform in [-scale, scale), from `seed`.
fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| scale * (2.0 * (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32 - 1.0))
        .collect()
}

fn upload<T: common::backend::Elem>(be: &CpuBackend, data: &[T]) -> <CpuBackend as Backend>::Buffer<T> {
    let buf = be.alloc::<T>(data.len()).unwrap();
    be.write(&buf, 0, data).unwrap();
    buf
}

fn act(buf: &<CpuBackend as Backend>::Buffer<f32>) -> Span<'_, Act> {
    buf.span().act()
}

#[test]
fn quantization_is_its_definition_and_keeps_the_largest_magnitude() {
    let be = CpuBackend::new(2).unwrap();
    let n = 10_001;
    let mut x = random(n, 3, 600.0);
    x[77] = -1234.5; // the largest magnitude, negative
    for format in [Fp8::E4M3, Fp8::E5M2] {
        let scale = 0.25;
        let (src, s, amax) = (upload(&be, &x), upload(&be, &[scale]), upload(&be, &[0.5f32]));
        let dst = be.alloc::<u8>(n).unwrap();
        be.quantize_fp8(dst.span(), amax.span(), act(&src), s.span(), n, format);
        let mut got = vec![0u8; n];
        be.read(&dst, 0, &mut got).unwrap();
        let want: Vec<u8> = x.iter().map(|&v| format.encode(v * scale)).collect();
        assert_eq!(got, want, "{format:?}");
        let mut top = [0.0f32];
        be.read(&amax, 0, &mut top).unwrap();
        assert_eq!(top[0], 1234.5, "{format:?}: amax");
    }
}

#[test]
fn the_product_is_the_sum_of_the_exact_values() {
    let be = CpuBackend::new(2).unwrap();
    let (r, s, k) = (32, 48, 80);
    for formats in [[Fp8::E4M3, Fp8::E4M3], [Fp8::E5M2, Fp8::E4M3]] {
        let x: Vec<u8> = random(r * k, 5, 3.0).iter().map(|&v| formats[0].encode(v)).collect();
        let y: Vec<u8> = random(s * k, 6, 3.0).iter().map(|&v| formats[1].encode(v)).collect();
        let bias = random(s, 7, 1.0);
        let (xb, yb, bb) = (upload(&be, &x), upload(&be, &y), upload(&be, &bias));
        let (dx, dy) = (upload(&be, &[0.5f32]), upload(&be, &[3.0f32]));
        let out = be.alloc::<f32>(r * s).unwrap();
        be.matmul_fp8(
            act(&out),
            xb.span(),
            yb.span(),
            Some(act(&bb)),
            [dx.span(), dy.span()],
            [r, s, k],
            formats,
        );
        let mut got = vec![0.0f32; r * s];
        be.read(&out, 0, &mut got).unwrap();
        for i in 0..r {
            for j in 0..s {
                let sum: f64 = (0..k)
                    .map(|l| formats[0].decode(x[i * k + l]) as f64 * formats[1].decode(y[j * k + l]) as f64)
                    .sum();
                let want = sum * 1.5 + bias[j] as f64;
                let g = got[i * s + j] as f64;
                assert!(
                    (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{formats:?} ({i},{j}): {g} vs {want}"
                );
            }
        }
    }
}

/// An E4M3 product of (R,16)·(16,16)ᵀ on the CPU, its two scales the values at `scales[0]`
/// and `scales[1]` of one buffer of 8.
fn product_of(r: usize, scales: [usize; 2]) {
    let be = CpuBackend::new(1).unwrap();
    let (x, y, out, d) = (
        upload(&be, &vec![0u8; r * 16]),
        upload(&be, &[0u8; 16 * 16]),
        upload(&be, &vec![0.0f32; r * 16]),
        upload(&be, &[1.0f32; 8]),
    );
    let dequant = scales.map(|at| d.span().slice(at, 1));
    be.matmul_fp8(
        act(&out),
        x.span(),
        y.span(),
        None,
        dequant,
        [r, 16, 16],
        [Fp8::E4M3; 2],
    );
}

#[test]
#[should_panic(expected = "multiple of 16")]
fn a_product_off_the_tensor_cores_shapes_is_refused() {
    product_of(24, [0, 0]);
}

#[test]
#[should_panic(expected = "16-byte aligned")]
fn a_scale_off_16_bytes_is_refused() {
    product_of(16, [0, 1]);
}
