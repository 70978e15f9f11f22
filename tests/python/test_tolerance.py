"""The agreement rule of filter and judge (python/opforge/tolerance.py)."""
import math
import sys
import unittest
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from opforge import tolerance as tol  # noqa: E402


class AgreementRule(unittest.TestCase):
    def test_is_allclose_for_outputs_of_unit_magnitude(self):
        g = torch.Generator().manual_seed(0)
        ref = torch.rand(4096, generator=g) * 2 - 1  # |ref| <= 1: the scale is 1
        for eps in (0.5e-2, 0.9e-2, 1.1e-2, 3e-2):
            out = ref + eps
            self.assertEqual(tol.tensor_close(out, ref), torch.allclose(out, ref, rtol=1e-2, atol=1e-2), eps)

    def test_absolute_part_is_in_the_outputs_own_units_above_one(self):
        # Mamba2-like: values ~1e20, a few cancelled to ~0, float32 rounding ~1e14 everywhere.
        g = torch.Generator().manual_seed(1)
        ref = torch.randn(4096, generator=g, dtype=torch.float64) * 1e20
        ref[::512] = 0.0
        out = ref + torch.randn(4096, generator=g, dtype=torch.float64) * 1e14
        self.assertFalse(torch.allclose(out, ref, rtol=1e-2, atol=1e-2), "plain allclose fails the cancelled elements")
        self.assertTrue(tol.tensor_close(out, ref))
        # ...but an error of a tenth of the output's typical size is still wrong.
        wrong = ref.clone()
        wrong[7] += 0.1 * ref.abs().mean()
        wrong[7::512] += 0.1 * ref.abs().mean()
        self.assertFalse(tol.tensor_close(wrong, ref))

    def test_a_few_huge_elements_do_not_excuse_the_rest(self):
        # An adversary's shortcut on an outlier-dominated output: the huge elements exact, the
        # rest left at zero. The mean magnitude (1e6) would allow 1e4 of error everywhere.
        g = torch.Generator().manual_seed(2)
        ref = torch.randn(100_000, generator=g)
        ref[:10] = 1e10
        lazy = torch.zeros_like(ref)
        lazy[:10] = ref[:10]
        self.assertGreater(tol.scale_of(ref), 1e5)
        self.assertFalse(tol.tensor_close(lazy, ref))
        self.assertTrue(tol.tensor_close(ref.clone(), ref))

    def test_a_float16_output_too_large_to_sum_in_float16_keeps_its_tolerance(self):
        # 2^20 halves of ~0.25: their L1 norm (~2.6e5) overflows float16 to inf, which made the
        # absolute tolerance infinite and let 1% of the elements be anything finite.
        g = torch.Generator().manual_seed(3)
        ref = (torch.rand(1 << 20, generator=g) * 0.5).half()
        wrong = ref.clone()
        wrong[::101] = 1000.0
        self.assertEqual(torch.linalg.vector_norm(ref, ord=1).item(), float("inf"), "the overflow this guards")
        self.assertEqual(tol.scale_of(ref), 1.0, "a mean magnitude of 0.25, taken in 64 bits")
        self.assertFalse(tol.tensor_close(wrong, ref))
        self.assertTrue(tol.tensor_close(ref.clone(), ref))
        big = torch.full((1 << 20,), 300.0).half()  # mean magnitude 300: the scale is the output's own
        self.assertAlmostEqual(tol.scale_of(big), 300.0, places=3)

    def test_a_reference_with_inf_gets_the_plain_tolerance(self):
        ref = torch.ones(1000)
        ref[0] = float("inf")
        self.assertEqual(tol.scale_of(ref), 1.0)
        wrong = ref.clone()
        wrong[1:11] = 500.0  # 1% of the elements far off: an infinite scale would have let them pass
        self.assertFalse(tol.tensor_close(wrong, ref))
        self.assertTrue(tol.tensor_close(ref.clone(), ref), "inf where the reference has inf agrees")

    def test_no_constant_passes_for_an_output_narrower_than_atol(self):
        # A softmax over 16,384 uniform inputs: elements ~6e-5, all within the plain atol of 0.
        g = torch.Generator().manual_seed(4)
        x = torch.rand(8, 16384, generator=g)
        ref = torch.softmax(x, 1)
        self.assertTrue(torch.allclose(torch.zeros_like(ref), ref, rtol=1e-2, atol=1e-2), "the hole")
        self.assertFalse(tol.tensor_close(torch.zeros_like(ref), ref))
        self.assertFalse(tol.tensor_close(torch.full_like(ref, ref.mean().item()), ref))
        self.assertTrue(tol.tensor_close(torch.softmax(x.double(), 1).float(), ref), "float64's answer still agrees")
        # An output deviating from its mean by atol or more on average keeps the plain rule.
        wide = torch.linspace(0, 0.2, 1000)
        self.assertEqual(tol.narrow_atol(wide, 1e-2), 1e-2)
        self.assertTrue(tol.tensor_close(wide + 0.009, wide))
        self.assertEqual(tol.narrow_atol(torch.zeros(10), 1e-2), tol.NARROW_FLOOR, "an all-zero output: the floor")

    def test_a_few_large_elements_do_not_excuse_a_small_bulk(self):
        # One dominant logit a row: its softmax element ~0.9 spans the output past 4 atol, while
        # the other 16,383 are ~1e-5; keeping only the dominant ones passed on the output's span.
        g = torch.Generator().manual_seed(5)
        x = torch.randn(16, 16384, generator=g)
        x[:, 0] += 10
        ref = torch.softmax(x, 1)
        lazy = torch.zeros_like(ref)
        lazy[:, 0] = ref[:, 0]
        self.assertGreater((ref.max() - ref.min()).item(), 0.04)
        self.assertFalse(tol.tensor_close(lazy, ref))
        self.assertTrue(tol.tensor_close(torch.softmax(x.double(), 1).float(), ref), "float64's answer still agrees")

    def test_no_constant_passes_for_an_output_within_rtol_of_its_offset(self):
        # 5 + softmax over 256 inputs: every element within rtol x 5 of 5.0, so the plain rule
        # passed the constant 5.0 (or the mean) for it: the centred rule judges the variation.
        g = torch.Generator().manual_seed(6)
        x = torch.rand(8, 256, generator=g) * 4
        ref = 5 + torch.softmax(x, 1)
        self.assertTrue(torch.allclose(torch.full_like(ref, 5.0), ref, rtol=1e-2, atol=1e-2 * 5), "the hole")
        self.assertTrue(tol.one_value_passes(ref.min().item(), ref.max().item(), 1e-2, 1e-2 * tol.scale_of(ref)))
        for c in (5.0, ref.mean().item(), ref.median().item()):
            self.assertFalse(tol.tensor_close(torch.full_like(ref, c), ref), c)
        self.assertTrue(tol.tensor_close((5 + torch.softmax(x.double(), 1)).float(), ref), "float64's answer agrees")
        # A row mean of y + 5 (spread ~0.016 about 5) under another summation order still agrees.
        y = torch.randn(1024, 4096, generator=g)
        ref = (y + 5).mean(1)
        self.assertTrue(tol.tensor_close((y.double() + 5).mean(1).float(), ref))
        self.assertTrue(tol.tensor_close(y.mean(1) + 5, ref), "the algebraically moved offset agrees")
        self.assertFalse(tol.tensor_close(torch.full_like(ref, 5.0), ref))
        # Below CENTRED_REL of its magnitude an output's variation is not judged: 5 + softmax over
        # 16,384 varies by ~1e-5 of 5, and the filter keeps such a task out (constant_within_tolerance).
        ref = 5 + torch.softmax(torch.rand(8, 16384, generator=g), 1)
        self.assertTrue(tol.tensor_close(torch.full_like(ref, 5.0), ref))

    def test_an_honest_accumulation_onto_a_large_offset_agrees(self):
        # Bias-first float32 accumulation of 4,096 products onto a bias of 1000 (one running sum a
        # element, as a naive kernel does): ~5e-3 from the reference, 1e-4 of the magnitude allows it.
        g = torch.Generator().manual_seed(7)
        x, w = torch.randn(16, 4096, generator=g), torch.randn(64, 4096, generator=g) * 1e-2
        b = torch.full((64,), 1000.0)
        ref = torch.addmm(b, x, w.t())
        acc = b.expand(16, 64).clone()
        for k in range(0, 4096, 8):
            acc += x[:, k:k + 8] @ w[:, k:k + 8].t()
        self.assertGreater((acc - ref).abs().max().item(), 1e-4, "the accumulation this allows")
        self.assertTrue(tol.tensor_close(acc, ref))
        self.assertTrue(tol.tensor_close(torch.addmm(b.double(), x.double(), w.double().t()).float(), ref))

    def test_a_rank_one_shortcut_of_a_rand_matmul_is_wrong(self):
        # torch.rand A [M,K] @ B [K,N]: values ~K/4 +- 20, so the plain rule's scaled atol (K/400)
        # passed outer(A.sum(1), B.sum(0)) / K, a thousandth of the work (red-team, s35).
        g = torch.Generator().manual_seed(8)
        a, b = torch.rand(256, 8192, generator=g), torch.rand(8192, 256, generator=g)
        ref = a @ b
        cheap = torch.outer(a.sum(1), b.sum(0)) / 8192
        scale = tol.scale_of(ref)
        self.assertTrue(torch.allclose(cheap, ref, rtol=1e-2, atol=1e-2 * scale), "the hole")
        self.assertFalse(tol.tensor_close(cheap, ref))
        self.assertTrue(tol.tensor_close((a.double() @ b.double()).float(), ref))
        split = sum(a[:, k:k + 1024] @ b[k:k + 1024] for k in range(0, 8192, 1024))
        self.assertTrue(tol.tensor_close(split, ref), "split-K agrees")

    def test_a_scalar_is_judged_to_a_thousandth(self):
        # A mean squared error over 4M elements, computed on 0.1% of its rows: 2% of slack on one
        # number let the sample pass; the centred rule's floor for a scalar is 1e-3 of it.
        g = torch.Generator().manual_seed(9)
        p, t = torch.randn(2048, 2048, generator=g), torch.randn(2048, 2048, generator=g)
        ref = ((p - t) ** 2).mean()
        sample = ((p[:2] - t[:2]) ** 2).mean()
        self.assertTrue(torch.allclose(sample, ref, rtol=1e-2, atol=1e-2), "the hole")
        self.assertFalse(tol.tensor_close(sample, ref))
        self.assertTrue(tol.tensor_close(((p.double() - t.double()) ** 2).mean().float(), ref))
        self.assertTrue(tol.tensor_close(((p - t) ** 2).sum(1).sum() / p.numel(), ref), "another order agrees")
        # One float accumulated block by block (1024 elements a block, the blocks added in turn
        # into one float32, as atomics do): honest, and inside the floor.
        acc = torch.zeros((), dtype=torch.float32)
        for blk in ((p - t) ** 2).reshape(-1, 1024).sum(1):
            acc += blk
        self.assertTrue(tol.tensor_close(acc / p.numel(), ref))

    def test_an_integer_count_is_judged_by_its_variation(self):
        # (x > 0).sum(1) over 2^18 columns: 131072 +- 256, within the plain tolerance of 131072.
        g = torch.Generator().manual_seed(10)
        ref = (torch.randn(64, 1 << 18, generator=g) > 0).sum(1)
        self.assertTrue(torch.allclose(torch.full_like(ref, 131072), ref, rtol=1e-2, atol=1e-2), "the hole")
        self.assertFalse(tol.tensor_close(torch.full_like(ref, 131072), ref))
        self.assertTrue(tol.tensor_close(ref.clone(), ref))

    def test_nan_shape_and_dtype_never_agree(self):
        ref = torch.ones(8)
        self.assertFalse(tol.tensor_close(torch.full((8,), float("nan")), ref))
        self.assertFalse(tol.tensor_close(torch.ones(1), ref), "no broadcasting")
        self.assertFalse(tol.tensor_close(torch.ones(8, dtype=torch.float64), ref))
        self.assertFalse(tol.close([ref], [ref, ref]))
        self.assertEqual(tol.max_error([torch.full((8,), float("nan"))], [ref]), float("inf"))

    def test_integer_outputs_are_compared_exactly_in_unit_scale(self):
        ref = torch.arange(1000)
        self.assertTrue(tol.tensor_close(ref.clone(), ref))
        self.assertFalse(tol.tensor_close(ref + 1, ref), "1 > atol + rtol * |ref| for the small entries")

    def test_references_are_float32_proper(self):
        torch.backends.cudnn.allow_tf32 = True
        tol.exact_fp32()
        self.assertFalse(torch.backends.cudnn.allow_tf32)
        self.assertFalse(torch.backends.cuda.matmul.allow_tf32)



def _bf16(t):
    return t.bfloat16().float()


def _tf32(t):
    """float32 with its mantissa rounded to TF32's 10 bits (what a TF32 tensor core multiplies)."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


class PrecisionRatio(unittest.TestCase):
    """An answer's distance from float64 in units of float32 eager's own (precision_ratio)."""

    def setUp(self):
        g = torch.Generator().manual_seed(11)
        self.x = torch.randn(128, 1024, generator=g)
        self.w = torch.randn(2048, 1024, generator=g) / 32
        self.ref = self.x @ self.w.T
        self.truth = self.x.double() @ self.w.double().T

    def ratio(self, out, terms=1.0):
        return tol.precision_ratio(out, self.ref, self.truth, terms)

    def test_lower_precision_operands_pass_the_rule_and_fail_the_ratio(self):
        for name, cast in (("bf16", _bf16), ("tf32", _tf32)):
            cheap = cast(self.x) @ cast(self.w).T
            self.assertTrue(tol.close([cheap], [self.ref]), f"the hole ({name})")
            self.assertGreater(self.ratio(cheap), tol.PRECISION_RATIO, name)

    def test_honest_float32_orders_are_within_it(self):
        split = sum(self.x[:, k::8] @ self.w[:, k::8].T for k in reversed(range(8)))
        sequential = torch.zeros_like(self.ref)
        for k in range(0, 1024, 64):  # a naive accumulation, a slice of K at a time
            sequential += self.x[:, k:k + 64] @ self.w[:, k:k + 64].T
        for name, out in (("float64 cast", self.truth.float()), ("split-K", split), ("sequential", sequential)):
            self.assertLess(self.ratio(out), 4, name)

    def test_a_statistic_taken_as_its_expected_value_fails(self):
        # softmax over 65,536 rand columns with the normaliser N(e - 1) instead of computed: inside
        # the 1e-2 rule (the normaliser varies by ~0.1% a row).
        x = torch.rand(16, 65536, generator=torch.Generator().manual_seed(12))
        ref, truth = torch.softmax(x, 1), torch.softmax(x.double(), 1)
        guess = torch.exp(x) / (65536 * (math.e - 1))
        self.assertTrue(tol.close([guess], [ref]), "the hole")
        self.assertGreater(tol.precision_ratio(guess, ref, truth), tol.PRECISION_RATIO)
        shifted = torch.exp(x - x.max(1, keepdim=True).values)
        self.assertLess(tol.precision_ratio(shifted / shifted.sum(1, keepdim=True), ref, truth), 4)

    def test_a_large_sum_is_not_held_to_torchs_pairwise_order(self):
        # One float32 accumulated a block at a time (as block atomics do) over 4M terms: honest,
        # ~eps sqrt(blocks) from the truth; terms (inputs over outputs) sets the yardstick's floor.
        d = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(13)) ** 2
        ref, truth = d.mean(), d.double().mean()
        acc = torch.zeros((), dtype=torch.float32)
        for blk in d.reshape(-1, 512).sum(1):
            acc += blk
        worst, at = tol.precision_check([acc / d.numel()], [ref], [truth], d.numel())
        self.assertEqual(at, 0)
        self.assertLess(worst, 1)

    def test_a_lower_precision_before_a_reduction_fails(self):
        # Linear 1024 -> 2048, GELU, mean over the 2048 features: terms (inputs per output) is 1024.
        # The floor was 4 eps sqrt(terms) until judge-14, and the bf16 GEMM came out 13-20 units
        # (red-team, s37); an honest sequential mean stays well inside the floor of now.
        g = torch.Generator().manual_seed(14)
        x, w = torch.randn(2, 128, 1024, generator=g), (torch.rand(2048, 1024, generator=g) * 2 - 1) / 32
        b = (torch.rand(2048, generator=g) * 2 - 1) / 32
        task = lambda x, w, b: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))  # noqa: E731
        ref, truth = task(x, w, b).mean(-1), task(x.double(), w.double(), b.double()).mean(-1)
        cheap = task(_bf16(x), _bf16(w), b).mean(-1)
        self.assertTrue(tol.close([cheap], [ref]), "the hole")
        worst, _ = tol.precision_check([cheap], [ref], [truth], x.numel())
        self.assertGreater(worst, tol.PRECISION_RATIO)
        h = task(x, w, b)
        sequential = torch.zeros_like(ref)
        for j in range(h.shape[-1]):  # one feature at a time, float32
            sequential += h[..., j]
        worst, _ = tol.precision_check([sequential / h.shape[-1]], [ref], [truth], x.numel())
        self.assertLess(worst, 4)

    def test_what_it_does_not_apply_to(self):
        ints = torch.arange(6)
        self.assertIsNone(tol.precision_ratio(ints, ints, ints.double()))
        self.assertIsNone(tol.precision_ratio(self.ref, self.ref, torch.full_like(self.truth, float("inf"))))
        self.assertEqual(tol.precision_ratio(self.ref, self.ref, self.ref.double()), 0.0)
        self.assertEqual(tol.precision_check([ints], [ints], [ints.double()], 6), (None, None))

    def test_float64_outputs_widen_the_model_and_inputs(self):
        class Scaled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 4)

            def forward(self, x, k):
                return self.lin(x) * k

        lin = Scaled()
        x = torch.randn(3, 8)
        (out,) = tol.float64_outputs(lin, [x, 2], lambda o: [o])
        self.assertEqual(out.dtype, torch.float64)
        self.assertEqual(lin.lin.weight.dtype, torch.float32, "the task's model is not changed")
        self.assertTrue(torch.allclose(out.float(), lin(x, 2), atol=1e-6))
        self.assertEqual(tol.input_numel([x, 2, torch.arange(4)]), 24)

    def test_complex_float64_and_plain_attribute_outputs_are_checked(self):
        # Each passed unchecked until judge-15 / filter-9 (red-team, s38): a complex64 FFT of
        # TF32-rounded inputs, a float64 task computed in float32, and a task whose weight is a
        # plain tensor attribute (its float64 run failed, so the check was skipped).
        g = torch.Generator().manual_seed(38)
        x = torch.randn(64, 4096, generator=g)
        ref = torch.fft.fft(x)
        worst, _ = tol.precision_check([torch.fft.fft(_tf32(x))], [ref], [torch.fft.fft(x.double())], x.numel())
        self.assertGreater(worst, tol.PRECISION_RATIO)
        self.assertLess(tol.precision_check([ref], [ref], [torch.fft.fft(x.double())], x.numel())[0], 4)

        w64, x64 = torch.randn(512, 512, generator=g, dtype=torch.float64) / 23, x[:, :512].double()
        ref64 = x64 @ w64.t()
        narrow = ((x64.float() @ w64.float().t())).double()
        self.assertTrue(tol.close([narrow], [ref64]), "the hole")
        self.assertGreater(tol.precision_check([narrow], [ref64], [ref64], x64.numel())[0], tol.PRECISION_RATIO)

        class Plain(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.randn(256, 512, generator=g) / 23  # not a Parameter, not a buffer

            def forward(self, x):
                return x @ self.weight.t()

        m = Plain()
        (truth,) = tol.float64_outputs(m, [x[:, :512]], lambda o: [o])
        self.assertEqual(truth.dtype, torch.float64)
        self.assertEqual(m.weight.dtype, torch.float32, "the task's model is not changed")
        cheap = _tf32(x[:, :512]) @ _tf32(m.weight).t()
        self.assertGreater(tol.precision_check([cheap], [m(x[:, :512])], [truth], 512 * 64)[0], tol.PRECISION_RATIO)


    def test_the_truth_makes_its_own_constants_in_float64(self):
        # A float64 task whose forward makes a constant at the default dtype: with that constant
        # float32 in the truth too, the truth equalled the reference and an exact answer was 3.5e7
        # units off (review, s38).
        class Ramp(torch.nn.Module):
            def forward(self, x):
                return x * torch.linspace(0, 1, x.shape[-1]) + torch.arange(x.shape[-1]) * 0.1

        x = torch.randn(64, 1000, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        m = Ramp()
        (truth,) = tol.float64_outputs(m, [x], lambda o: [o])
        exact = x * torch.linspace(0, 1, 1000, dtype=torch.float64) + torch.arange(1000) * 0.1
        self.assertLess(tol.precision_check([exact], [m(x)], [truth], x.numel())[0], 4)
        self.assertEqual(torch.get_default_dtype(), torch.float32, "the default dtype is restored")


if __name__ == "__main__":
    unittest.main()
