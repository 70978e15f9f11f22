"""Unit tests of python/opforge/static_check.py (judge-side static evidence).

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from opforge import static_check as sc  # noqa: E402

HONEST = '''
import os
import math
from typing import List, Optional
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
__global__ void k(float* y) {}
torch::Tensor fn(torch::Tensor x, torch::Tensor w, torch::Tensor b) { return x; }
"""
ext = load_inline(name="honest", cpp_sources=_SRC, functions=["fn"], extra_cflags=["-O3", "-std=c++17"],
                  extra_cuda_cflags=["-O3", "--use_fast_math", "-lineinfo"], extra_ldflags=["-lcublas"],
                  verbose=False)
_counter = 0


class Helper:  # a plain class: fine
    def __init__(self, n):
        self.n = n


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.helper = Helper(3)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        global _counter
        _counter += 1
        path = os.path.join(os.path.dirname(__file__), "k.cpp")
        n = x.size(0)
        k = x.shape[-1] * 2 + int(math.sqrt(4))
        if x.dim() != 2 or n == 0:
            raise ValueError(f"bad input {path}")
        out = torch.empty_like(x)
        flat = x.view(-1, x.size(1))
        y = ext.fn(flat.contiguous(), self.linear.weight, self.linear.bias)
        stream = torch.cuda.current_stream() if x.is_cuda else None
        shape = list(x.shape)
        shape.append(k)
        return y.view(n, -1)
'''


def src(body):
    """A minimal solution around `body` (module level)."""
    return textwrap.dedent(body)


def forward_src(body, imports=""):
    return (f"import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport functools\n{imports}\n"
            "from torch.utils.cpp_extension import load_inline\n"
            "ext = load_inline(name='e', cpp_sources='', functions=['fn'])\n"
            "class ModelNew(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.linear = nn.Linear(4, 4)\n"
            "    def forward(self, x, w):\n"
            + textwrap.indent(textwrap.dedent(body), " " * 8))


def whats(findings):
    return " | ".join(f.what for f in findings)


class SourceHonest(unittest.TestCase):
    def test_honest_solution_has_no_finding(self):
        self.assertEqual(sc.check_source({"sol.py": HONEST}), [])
        self.assertEqual(sc.check_source({"sol.py": HONEST}, strict=False), [])

    def test_repo_fixtures_honest(self):
        for rel in ("tests/fixtures/eval/solutions/linear_relu.py",
                    "tests/fixtures/eval/agent_solutions/linear_relu/model_new.py"):
            path = os.path.join(REPO, rel)
            if not os.path.exists(path):
                continue
            with open(path) as f:
                self.assertEqual(sc.check_source({os.path.basename(path): f.read()}), [], rel)

    def test_other_honest_patterns(self):
        cases = {
            "cuda_extension module": "import torch.nn as nn\nimport cuda_extension\n"
                                     "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                                     "        return cuda_extension.fwd(x)\n",
            "from cuda_extension": "import torch.nn as nn\nfrom cuda_extension import fwd as f\n"
                                   "class ModelNew(nn.Module):\n    def forward(self, x):\n        return f(x)\n",
            "factory with cache": "import torch, torch.nn as nn\nfrom torch.utils.cpp_extension import load\n"
                                  "import os.path\n_e = None\n"
                                  "def _get():\n    global _e\n    if _e is None:\n"
                                  "        _e = load(name='x', sources=[os.path.join(os.path.dirname(__file__), 'k.cu')])\n"
                                  "    return _e\n"
                                  "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                                  "        out = torch.zeros(x.size(0), device=x.device, dtype=x.dtype)\n"
                                  "        _get().run(x, out, torch.cuda.current_stream().cuda_stream)\n"
                                  "        return out\n",
            "ext on self": "import torch.nn as nn\nimport torch.utils.cpp_extension as ce\n"
                           "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                           "        self.ext = ce.load_inline(name='a', cpp_sources='', functions=['f'])\n"
                           "        self.p = nn.Parameter(torch.zeros(3))\n"
                           "    def forward(self, x):\n        return self.ext.f(x, self.p)\n"
                           "import torch\n",
            "helper method via self": "import torch, torch.nn as nn\nimport cuda_extension as ce\n"
                                      "class ModelNew(nn.Module):\n    def _launch(self, x):\n"
                                      "        return ce.f(x.contiguous())\n"
                                      "    def forward(self, x):\n        return self._launch(x).view(x.shape)\n",
            "env read": "import os\nflag = os.environ.get('X', '0')\ncwd = os.getcwd() + os.sep\n",
            "getattr literal": "import torch\nf = getattr(torch, 'float32')\nok = hasattr(torch, 'cuda')\n",
            "nonlocal closure": "def outer():\n    n = 0\n    def inner():\n        nonlocal n\n        n += 1\n"
                                "    return inner\n",
            "main guard": "if __name__ == '__main__':\n    pass\n",
            "streams and events": "import torch, torch.nn as nn\nimport cuda_extension as ce\n"
                                  "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                                  "        s = torch.cuda.current_stream()\n"
                                  "        s.wait_stream(torch.cuda.default_stream())\n"
                                  "        out = torch.empty(x.shape, dtype=torch.float32, device=x.device,\n"
                                  "                          memory_format=torch.contiguous_format)\n"
                                  "        ce.f(x, out, s.cuda_stream)\n"
                                  "        return out if x.is_cuda else out.view(x.shape)\n",
        }
        for name, text in cases.items():
            with self.subTest(name):
                self.assertEqual(whats(sc.check_source({"s.py": text})), "")


class SourceForbidden(unittest.TestCase):
    def assertFlag(self, text, needle, strict=True):
        found = sc.check_source({"s.py": text}, strict=strict)
        self.assertTrue(found, f"no finding for:\n{text}")
        self.assertTrue(all(f.kind == sc.SUSPICIOUS_SOURCE for f in found))
        self.assertIn(needle, whats(found), text)
        return found

    def test_imports(self):
        for mod in ("numpy", "ctypes", "gc", "sys", "inspect", "threading", "multiprocessing", "subprocess",
                    "signal", "importlib", "builtins", "socket", "mmap", "pickle", "json", "time",
                    "torch.overrides", "torch._dynamo", "torch.utils._python_dispatch", "os.path.os"):
            with self.subTest(mod):
                self.assertFlag(f"import {mod}\n", f"imports {mod}")
                self.assertFlag(f"import {mod} as m\n", f"imports {mod}", strict=False)
        self.assertFlag("from numpy import zeros\n", "imports numpy")
        self.assertFlag("from torch import _C\n", "_C")
        self.assertFlag("from torch import ops\n", "torch.ops")
        self.assertFlag("from torch import *\n", "import *")
        self.assertFlag("from os import system\n", "from os import system")
        self.assertFlag("from os import environ\n", "from os import environ")
        self.assertFlag("from torch.utils.cpp_extension import _import_module_from_library\n", "cpp_extension")
        self.assertFlag("from . import sibling\n", "relative import")
        self.assertFlag("from typing import get_type_hints\n", "evaluates strings")

    def test_builtins(self):
        for call in ("exec('x=1')", "eval('1')", "compile('1', 'f', 'eval')", "__import__('os')", "globals()",
                     "vars()", "locals()", "open('/etc/passwd')", "breakpoint()"):
            name = call.split("(")[0]
            with self.subTest(call):
                self.assertFlag(f"x = {call}\n", name, strict=False)
        self.assertFlag("e = eval\n", "eval")
        for call in ("getattr(o, n)", "setattr(o, n, 1)", "delattr(o, n)", "hasattr(o, n)"):
            with self.subTest(call):
                self.assertFlag(f"o = object()\nn = 'a'\n{call}\n", "computed attribute name", strict=False)
        self.assertFlag("g = getattr\n", "as a value")
        self.assertFlag("T = type('T', (object,), {})\n", "type(name, bases, dict)")

    def test_dunders_and_frames(self):
        for attr in ("__class__", "__dict__", "__globals__", "__code__", "__closure__", "__builtins__",
                     "__subclasses__", "__mro__", "__bases__", "__self__"):
            with self.subTest(attr):
                self.assertFlag(f"x = (1).{attr}\n", attr, strict=False)
        self.assertFlag("b = __builtins__\n", "__builtins__")
        self.assertFlag("import torch\nx = getattr(torch, '__dict__')\n", "__dict__")
        self.assertFlag("k = {'__torch_function__': 1}\n", "__torch_function__")
        for attr in ("f_locals", "f_back", "f_globals", "gi_frame", "tb_frame", "_getframe", "setprofile",
                     "settrace"):
            with self.subTest(attr):
                self.assertFlag(f"def g():\n    yield 1\nx = g().{attr}\n", attr, strict=False)
        self.assertFlag("class A:\n    def __getattr__(self, n):\n        return 1\n", "__getattr__")
        self.assertFlag("import torch.nn as nn\nclass M(nn.Module):\n    def __call__(self, x):\n        return x\n",
                        "__call__")

    def test_torch_namespaces(self):
        for expr in ("torch._C._get_tracing_state", "torch._dynamo.reset", "torch.library.Library",
                     "torch.ops.aten.mm", "torch.overrides.TorchFunctionMode", "torch.utils._python_dispatch",
                     "torch.compile", "torch.jit.script", "torch.autograd.Function", "torch.profiler.profile",
                     "torch.load", "torch.hub.load", "torch.manual_seed"):
            with self.subTest(expr):
                self.assertFlag(f"import torch\nimport torch.utils\nx = {expr}\n", expr.split(".")[1], strict=False)
        for name in ("DisableTorchFunction", "_pop_mode", "_push_mode"):
            with self.subTest(name):
                self.assertFlag(f"import torch\nx = torch.{name}\n", name, strict=False)
        self.assertFlag("@__import__('torch').compile\ndef f():\n    pass\n", "__import__")
        self.assertFlag("import torch\n@torch.compile\ndef f(x):\n    return x\n", "torch.compile")
        self.assertFlag("import torch\nx = torch.os.system\n", ".os")
        self.assertFlag("import typing\nx = typing.sys.modules\n", ".sys")
        self.assertFlag("import torch\nx = torch._utils\n", "private")
        self.assertFlag("import torch\nx = getattr(torch, '_C')\n", "torch._C")

    def test_module_aliasing(self):
        self.assertFlag("import torch\nt = torch\n", "used as a value")
        self.assertFlag("import os\ndef f(m):\n    return m\nf(os)\n", "used as a value")
        self.assertFlag("import torch.nn as nn\nF = nn.functional\n", "used as a value")

    def test_os(self):
        for stmt in ("os.system('ls')", "os.environ['A'] = '1'", "os.fork()", "os.kill(1, 9)", "os.path.os.system('x')",
                     "os.environ.setdefault('A', '1')", "os._exit(0)"):
            with self.subTest(stmt):
                self.assertFlag(f"import os\n{stmt}\n", "os.", strict=False)

    def test_assignments(self):
        self.assertFlag("import torch\ntorch.allclose = lambda *a: True\n", "assigns torch.allclose", strict=False)
        self.assertFlag("import torch.nn as nn\nnn.Module.__call__ = lambda s, *a: None\n",
                        "assigns torch.nn.Module.__call__", strict=False)
        self.assertFlag("import time\ntime.perf_counter = lambda: 0.0\n", "assigns time.perf_counter", strict=False)
        self.assertFlag("import torch\nsetattr(torch.cuda, 'synchronize', None)\n", "assigns torch.cuda.synchronize")
        self.assertFlag("import torch\ndel torch.cuda.synchronize\n", "assigns torch.cuda.synchronize")
        self.assertFlag("import torch\ntorch.backends.cudnn.allow_tf32 = True\n", "assigns torch.backends")
        self.assertFlag("class A:\n    pass\nclass B:\n    def f(self):\n        self.__class__ = A\n",
                        "assigns __class__", strict=False)
        self.assertFlag(forward_src("return ext.fn(x)\n") + "ext.fn = F.relu\n", "assigns extension module.fn")
        self.assertFlag(forward_src("return ext.fn(x)\n") + "ModelNew.forward = lambda s, x, w: x\n",
                        "assigns ModelNew.forward")
        self.assertFlag("import torch.nn as nn\nclass M(nn.Module):\n    def __init__(self):\n"
                        "        super().__init__()\n        self.forward = lambda x: x\n", "forward attribute")
        self.assertFlag("import torch.nn as nn\nclass M(nn.Module):\n    def load_state_dict(self, *a, **k):\n"
                        "        pass\n", "overrides nn.Module.load_state_dict")
        self.assertFlag("import torch\nclass T(torch.Tensor):\n    pass\n", "subclasses torch.Tensor")
        self.assertFlag("class T(object, metaclass=type):\n    pass\n", "metaclass")
        self.assertFlag("import torch.nn as nn\nclass M(nn.Module):\n    def __init__(self):\n"
                        "        super().__init__()\n        self.register_forward_hook(print)\n",
                        "register_forward_hook")

    def test_forward_compute_strict_only(self):
        cases = {
            "return torch.matmul(x, w)": "torch.matmul",
            "return F.relu(x)": "torch.nn.functional.relu",
            "return torch.nn.functional.gelu(x)": "torch.nn.functional.gelu",
            "return x.sum()": ".sum()",
            "return x.mm(w).relu()": ".mm()",
            "return x @ w": "@",
            "return ext.fn(x) + 1": "tensor arithmetic",
            "y = torch.empty_like(x)\ny *= 2\nreturn y": "in-place",
            "return -x": "tensor operator",
            "return x > 0": "tensor comparison",
            "return self.linear(x)": "torch layer self.linear",
            "return self.linear.weight.relu()": ".relu()",
            "return x[w]": "indexing a tensor with a tensor",
            "return sum([x, w])": "sum()",
            "return x.to(torch.float16)": ".to()",
            "f = torch.matmul\nreturn f(x, w)": "torch.matmul",
            "return getattr(x, 'mm')(w)": ".mm()",
            "return (lambda t: t.exp())(x)": ".exp()",
            "return functools.partial(torch.mm, x)(w)": "torch.mm taken as a value",
            "f = x.mm\nreturn f(w)": ".mm taken as a value",
            "return [a * b for a, b in zip(x, w)]": "tensor arithmetic",
            "return torch.cuda.comm.reduce_add([x, w])": "torch.cuda.comm.reduce_add",
            "return nn.Linear.forward(self.linear, x)": "torch.nn.Linear.forward",
        }
        for body, needle in cases.items():
            text = forward_src(body + "\n")
            with self.subTest(body):
                self.assertFlag(text, needle)
                self.assertEqual(whats(sc.check_source({"s.py": text}, strict=False)), "")

    def test_torch_function_as_value_strict_only(self):
        for text in ("import torch\nOPS = [torch.matmul]\n",
                     "import torch.nn as nn\nimport torch.nn.functional as F\nclass M(nn.Module):\n"
                     "    def forward(self, x, act=F.relu):\n        return act(x)\n",
                     "import torch\nimport torch.nn as nn\nclass M(nn.Module):\n    def __init__(self):\n"
                     "        super().__init__()\n        self.f = torch.matmul\n"
                     "    def forward(self, x):\n        return self.f(x, x)\n"):
            with self.subTest(text):
                self.assertFlag(text, "taken as a value")
                self.assertEqual(whats(sc.check_source({"s.py": text}, strict=False)), "")
        # dtypes, memory formats, classes are values, not functions
        self.assertEqual(whats(sc.check_source({"s.py": "import torch\nD = (torch.float16, torch.channels_last, "
                                                        "torch.Tensor, torch.cuda.is_available)\n"})), "")

    def test_helpers_reached_from_forward_are_judged(self):
        text = forward_src("return helper(x) + self._impl(w)\n") + (
            "    def _impl(self, t):\n        return t.mm(t)\n"
            "def helper(t):\n    return torch.relu(t)\n")
        found = self.assertFlag(text, "torch.relu in helper()")
        self.assertIn(".mm() in _impl()", whats(found))
        # the same helper not reached from forward (e.g. weight preprocessing in __init__) is fine
        text = forward_src("return ext.fn(x)\n") + "def prep(t):\n    return torch.relu(t)\n"
        self.assertEqual(whats(sc.check_source({"s.py": text})), "")

    def test_build_flags(self):
        base = "from torch.utils.cpp_extension import load_inline\next = load_inline(name='a', cpp_sources='', {})\n"
        for kw, needle in (("extra_ldflags=['-ldl']", "-ldl"), ("extra_ldflags=['-Wl,-rpath,/tmp/x']", "rpath"),
                           ("extra_cflags=['-fplugin=/tmp/p.so']", "-fplugin"),
                           ("extra_cuda_cflags=['-ccbin', '/tmp/cc']", "-ccbin"),
                           ("extra_cflags=FLAGS", "not a literal list"), ("**opts", "**kwargs"),
                           ("extra_ldflags=['-L/tmp/evil', '-levil']", "-levil")):
            with self.subTest(kw):
                self.assertFlag("FLAGS = []\nopts = {}\n" + base.format(kw), needle, strict=False)

    def test_syntax_error_is_a_finding(self):
        found = sc.check_source({"bad.py": "def f(:\n    pass\n"})
        self.assertEqual(len(found), 1)
        self.assertEqual((found[0].kind, found[0].file, found[0].line), (sc.SUSPICIOUS_SOURCE, "bad.py", 1))
        self.assertIn("syntax error", found[0].what)
        self.assertIn("cannot parse", sc.check_source({"nul.py": "x = 1\0\n"})[0].what)

    def test_finding_fields(self):
        (f,) = sc.check_source({"m.py": "x = 1\nimport ctypes\n"})
        self.assertEqual((f.kind, f.file, f.line), ("suspicious_source", "m.py", 2))
        self.assertIn("ctypes", f.what)


# ---------------------------------------------------------------------------------------------

# what an honest torch extension imports (from a real build of the CPU fixture's sources)
HONEST_SYMBOLS = [
    "PyErr_SetString", "PyEval_GetBuiltins", "PyFrame_GetBack", "_Py_Dealloc", "PyObject_GetAttrString",
    "__cxa_begin_catch", "__gxx_personality_v0", "_Unwind_Resume@GCC_3.0", "memcpy@GLIBC_2.14", "malloc", "free",
    "operator new(unsigned long)@GLIBCXX_3.4", "operator delete(void*, unsigned long)",
    "at::TensorBase::__dispatch_contiguous(c10::MemoryFormat) const",
    "at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, "
    "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
    "at::_ops::zeros::call(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
    "std::optional<c10::Device>, std::optional<bool>)",
    "at::_ops::view::call(at::Tensor const&, c10::ArrayRef<c10::SymInt>)",
    "at::_ops::transpose_int::call(at::Tensor const&, long, long)",
    "at::_ops::narrow::call(at::Tensor const&, long, c10::SymInt, c10::SymInt)",
    "float* at::TensorBase::data_ptr<float>() const",
    "long c10::detail::maybe_wrap_dim_slow<long>(long, long, bool)",
    "c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)",
    "c10::impl::ExcludeDispatchKeyGuard::ExcludeDispatchKeyGuard(c10::DispatchKeySet)",
    "c10::UndefinedTensorImpl::_singleton", "caffe2::TypeMeta::error_unsupported_typemeta(caffe2::TypeMeta)",
    "vtable for torch::autograd::AutogradMeta", "typeinfo for c10::Error",
    "pybind11::detail::type_caster<at::Tensor, void>::load(pybind11::handle, bool)",
    "std::basic_ostream<char, std::char_traits<char> >& std::operator<< <std::char_traits<char> >"
    "(std::basic_ostream<char, std::char_traits<char> >&, char const*)@GLIBCXX_3.4",
    "VTT for std::__cxx11::basic_ostringstream<char, std::char_traits<char>, std::allocator<char> >",
    "c10::SymInt::operator long() const",
    # CUDA / BLAS / cuDNN / OpenMP
    "cudaLaunchKernel", "__cudaRegisterFunction", "c10::cuda::getCurrentCUDAStream(signed char)",
    "at::cuda::getCurrentCUDABlasHandle()", "at::cuda::getCurrentDeviceProperties()",
    "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, unsigned int, bool)",
    "cublasSgemm_v2", "cublasLtMatmul", "cudnnConvolutionForward", "at::native::getCudnnHandle()", "sgemm_",
    "cblas_sgemm", "LAPACKE_sgesv", "pthread_create", "GOMP_parallel", "omp_get_num_threads", "dladdr",
    "at::get_num_threads()", "at::internal::invoke_parallel(long, long, long, std::function<void (long, long)> const&)",
]


class Symbols(unittest.TestCase):
    def kinds(self, syms, strict=True):
        return [f.kind for f in sc.check_symbols(syms, strict=strict)]

    def test_brief_examples(self):
        self.assertEqual(self.kinds(["at::_ops::matmul::call(at::Tensor const&, at::Tensor const&)"]),
                         [sc.FORBIDDEN_OP])
        self.assertEqual(self.kinds(["at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>, "
                                     "std::optional<c10::ScalarType>)"]), [])
        self.assertEqual(self.kinds(["dlsym"]), [sc.DYNAMIC_SYMBOL_LOOKUP])
        self.assertEqual(self.kinds(["cublasSgemm_v2"]), [])
        self.assertEqual(self.kinds(["sgemm_"]), [])
        self.assertEqual(self.kinds(["aoti_torch_get_data_ptr", "aoti_torch_empty_strided"]), [])

    def test_honest_extension_imports(self):
        self.assertEqual(whats(sc.check_symbols(HONEST_SYMBOLS)), "")

    def test_forbidden(self):
        cases = {
            sc.FORBIDDEN_OP: [
                "at::_ops::relu::call(at::Tensor const&)",
                "at::_ops::add_Tensor::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&, "
                "c10::Scalar const&)",
                "at::_ops::slice_scatter::call(at::Tensor const&, at::Tensor const&)",  # exact names, no prefix
                "at::_ops::select_backward::call(at::Tensor const&)",
                "at::native::add(at::Tensor const&, at::Tensor const&, c10::Scalar const&)",
                "at::cpu::mm(at::Tensor const&, at::Tensor const&)",
                "at::cuda::bmm(at::Tensor const&, at::Tensor const&)",
                "at::matmul(at::Tensor const&, at::Tensor const&)",
                "at::Tensor at::mystery_function()",
                "at::TensorBase::add(at::Tensor const&) const",
                "at::cuda::blas::gemm<float>(char, char, long, long, long, float, float const*, long)",
                "c10::Dispatcher::singleton()",
                "c10::Dispatcher::findSchemaOrThrow(char const*, char const*)",
                "torch::jit::getOperation()",
                "torch::something_new()",
                "dnnl_primitive_execute", "cufftExecC2C", "cusparseSpMM",
                "DftiComputeForward", "DftiCreateDescriptor_s_1d", "vsExp", "xnn_run_operator",
                "fbgemm::fbgemmPacked<unsigned char, int, 2>(int)",
                "aoti_torch_cpu_convolution", "aoti_torch__scaled_dot_product_flash_attention",
                "aoti_torch_cuda_mm_out", "aoti_torch_addmm_out", "mkl_spblas_scsrmv", "mkl_vml_kernel_sExp_L9HAynn",
                "_ZN2at4_ops6matmul4callE_not_demangled",
            ],
            sc.DYNAMIC_SYMBOL_LOOKUP: ["dlopen", "dlsym@GLIBC_2.34", "dlvsym", "_dl_sym", "dl_iterate_phdr",
                                       "dlinfo", "PyRun_SimpleString", "PyImport_ImportModule"],
            sc.CALLBACK_TAMPERING: [
                "at::clearCallbacks()", "at::removeCallback(unsigned long)", "at::enableRecordFunction(bool)",
                "at::RecordFunctionGuard::RecordFunctionGuard(bool)",
                "at::addGlobalCallback(at::RecordFunctionCallback)",
                "at::addThreadLocalCallback(at::RecordFunctionCallback)",
                "torch::profiler::impl::ProfilerStateBase::push(std::shared_ptr<torch::profiler::impl::"
                "ProfilerStateBase>&&)",
                "torch::autograd::profiler::enableProfiler(torch::profiler::impl::ProfilerConfig const&)",
                "c10::impl::TorchDispatchModeTLS::pop_stack()",
                "c10::impl::tls_set_dispatch_key_excluded(c10::DispatchKey, bool)",
                "at::Context::setAllowTF32CuBLAS(bool)", "PyEval_SetProfile", "cuptiSubscribe",
            ],
            sc.PROCESS_CONTROL: ["fork", "vfork", "clone", "execve", "execvp", "posix_spawnp", "kill", "ptrace",
                                 "setsid", "prctl", "mprotect", "socket", "connect", "bind", "syscall", "system",
                                 "popen@GLIBC_2.2.5"],
        }
        for kind, syms in cases.items():
            for s in syms:
                with self.subTest(s):
                    found = sc.check_symbols([s])
                    self.assertEqual([f.kind for f in found], [kind], s)
                    self.assertIn(s, found[0].what)

    def test_strict_false_keeps_only_non_compute(self):
        syms = ["at::_ops::matmul::call(at::Tensor const&, at::Tensor const&)", "dlsym", "fork",
                "at::clearCallbacks()"]
        self.assertEqual(sorted(self.kinds(syms, strict=False)),
                         sorted([sc.DYNAMIC_SYMBOL_LOOKUP, sc.PROCESS_CONTROL, sc.CALLBACK_TAMPERING]))

    def test_symbol_path(self):
        self.assertEqual(sc.symbol_path("float* at::TensorBase::data_ptr<float>() const"),
                         ("", "at::TensorBase::data_ptr"))
        self.assertEqual(sc.symbol_path("vtable for torch::autograd::AutogradMeta"),
                         ("vtable for", "torch::autograd::AutogradMeta"))
        self.assertEqual(sc.symbol_path("std::vector<at::Tensor, std::allocator<at::Tensor> > at::foo(int)")[1],
                         "at::foo")
        self.assertEqual(sc.symbol_path("std::vector<at::Tensor, std::allocator<at::Tensor> >::~vector()")[1],
                         "std::vector::~vector")
        self.assertEqual(sc.symbol_path("memcpy@GLIBC_2.14"), ("", "memcpy"))


# ---------------------------------------------------------------------------------------------

def _compile(tmp, name, code, lang="c", flags=()):
    cc = shutil.which("cc" if lang == "c" else "c++")
    if not cc:
        raise unittest.SkipTest(f"no {'cc' if lang == 'c' else 'c++'}")
    srcf = os.path.join(tmp, f"{name}.{lang}")
    with open(srcf, "w") as f:
        f.write(code)
    out = os.path.join(tmp, f"lib{name}.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", srcf, "-o", out, *flags], check=True, capture_output=True)
    return out


DLSYM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
typedef void (*fn_t)(void);
void copy_and_lookup(char* dst, const char* src, unsigned long n) {
  memcpy(dst, src, n);
  fn_t f = (fn_t)dlsym(RTLD_DEFAULT, "_ZN2at4_ops6matmul4callERKNS_6TensorES4_");
  if (f) f();
}
"""


class RealSharedObject(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="static_check_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_dlsym_library(self):
        so = _compile(self.tmp, "probe", DLSYM_C, flags=["-ldl"])
        raw = sc.imported_symbols(so, demangle_names=False)
        self.assertIn("dlsym", raw)
        self.assertIn("memcpy", raw)
        syms = sc.imported_symbols(so)
        self.assertIn("dlsym", syms)
        found = sc.check_symbols(syms)
        self.assertEqual([f.kind for f in found], [sc.DYNAMIC_SYMBOL_LOOKUP], whats(found))
        self.assertEqual([f.kind for f in sc.check_extension(so)], [sc.DYNAMIC_SYMBOL_LOOKUP])
        self.assertTrue(any(n.startswith("libc.so") for n in sc.dynamic_info(so).needed))

    def test_section_headers_do_not_hide_imports(self):
        # the loader never reads section headers: strip them (e_shnum = 0), the imports stay visible
        so = _compile(self.tmp, "probe", DLSYM_C, flags=["-ldl"])
        with open(so, "r+b") as f:
            f.seek(0x3C)
            f.write(struct.pack("<H", 0))
        self.assertIn("dlsym", sc.imported_symbols(so, demangle_names=False))

    def test_cpp_import_is_demangled_and_judged(self):
        if not shutil.which("c++filt"):
            self.skipTest("no c++filt")
        so = _compile(self.tmp, "cpp", "namespace at { namespace _ops { struct matmul { static void call(int); };"
                                       " struct empty_like { static void call(int); }; } }\n"
                                       "extern \"C\" void k(int n) { at::_ops::matmul::call(n);"
                                       " at::_ops::empty_like::call(n); }\n", lang="cpp")
        syms = sc.imported_symbols(so)
        self.assertIn("at::_ops::matmul::call(int)", syms)
        self.assertIn("at::_ops::empty_like::call(int)", syms)
        self.assertEqual([(f.kind, f.what.split(": ", 1)[0]) for f in sc.check_symbols(syms)],
                         [(sc.FORBIDDEN_OP, "imports at::_ops::matmul::call(int)")])
        self.assertEqual(sc.check_symbols(syms, strict=False), [])

    def test_unexpected_library_and_runpath(self):
        evil = _compile(self.tmp, "evil", "void evil_fn(void) {}\n")
        so = _compile(self.tmp, "uses", "void evil_fn(void);\nvoid k(void) { evil_fn(); }\n",
                      flags=[f"-L{self.tmp}", "-levil", f"-Wl,-rpath,{self.tmp}", "-lm"])
        self.assertTrue(os.path.exists(evil))
        info = sc.dynamic_info(so)
        self.assertIn("libevil.so", info.needed)
        self.assertIn(self.tmp, info.rpath + info.runpath)
        found = sc.check_libraries(info)
        self.assertTrue(all(f.kind == sc.UNEXPECTED_LIBRARY for f in found))
        self.assertIn("libevil.so", whats(found))
        self.assertIn(self.tmp, whats(found))
        self.assertNotIn("libm.so", whats(found))
        self.assertEqual(sc.check_symbols(sc.imported_symbols(so)), [])  # evil_fn itself looks innocent

    def test_malformed_files(self):
        junk = os.path.join(self.tmp, "junk.so")
        for data in (b"not an elf at all", b"\x7fELF\x01\x01" + b"\0" * 60, b"\x7fELF\x02\x01" + b"\0" * 10,
                     b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, 0, 0, 64,
                                                                        56, 1000, 64, 0, 0)):
            with open(junk, "wb") as f:
                f.write(data)
            with self.subTest(data[:8]):
                with self.assertRaises(sc.StaticCheckError):
                    sc.dynamic_info(junk)
                (f,) = sc.check_extension(junk)
                self.assertEqual(f.kind, sc.FORBIDDEN_OP)
                self.assertIn("could not be inspected", f.what)
        with self.assertRaises(sc.StaticCheckError):
            sc.dynamic_info(os.path.join(self.tmp, "missing.so"))


class Hygiene(unittest.TestCase):
    def test_no_torch_import(self):
        code = "import sys; sys.path.insert(0, sys.argv[1]); import opforge.static_check; print('torch' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code, os.path.join(REPO, "python")], capture_output=True,
                             text=True, check=True).stdout.strip()
        self.assertEqual(out, "False")


if __name__ == "__main__":
    unittest.main()
