"""Writes data/kernelbench_ops.json: KernelBench level-2 op sequences, the op of each level-1
problem, and the table that maps opforge's traced op names onto the same vocabulary, for
`opforge dedup`'s op-sequence checks.

Input: KernelBench's problem names (facts, one `levelN/K_Name.py` per line), e.g.
../shared/data/kernelbench_problem_names.txt. Level-2 names spell their op sequence
(`12_Gemm_Multiply_LeakyReLU`); each word is lower-cased and mapped through NAME_SYNONYMS so
words that mean one operation (Scaling, Scale, Multiply) become one token. A level-1 name
describes one operation in words (`50_conv_standard_2D__square_input__square_kernel`,
`47_Sum_reduction_over_a_dimension`); LEVEL1_RULES turns it into that operation's token (the
first rule whose pattern the name matches; a name no rule matches has no token and is reported).

Usage: python3 data/tools/kernelbench_ops.py NAMES.txt > data/kernelbench_ops.json
"""
import json
import re
import sys

# KernelBench name word (lower-case) -> vocabulary token; words not listed are their own token.
NAME_SYNONYMS = {
    "conv2d": "conv2d", "matmul": "gemm", "gemm": "gemm", "bmm": "bmm",
    "scaling": "multiply", "scale": "multiply", "multiply": "multiply",
    "biasadd": "add", "residualadd": "add", "add": "add",
    "swish": "swish", "globalavgpool": "globalavgpool",
}

# (pattern over the lower-cased level-1 name, token). Order matters: the first match wins.
LEVEL1_RULES = [
    (r"batched_matrix_multiplication", "bmm"),
    (r"matrix_scalar_multiplication", "multiply"),
    (r"matrix_multiplication|matmul|matrix_vector", "gemm"),
    (r"conv_transposed_([123])d", r"convtranspose\1d"),
    (r"conv_(?:standard|depthwise|depthwise_separable|pointwise)_([123])d", r"conv\1d"),
    (r"max_pooling_([123])d", "maxpool"),
    (r"average_pooling_([123])d", "avgpool"),
    (r"^(sum|mean|max|min)_reduction", r"\1"),
    (r"^(argmax|argmin)_over", r"\1"),
    (r"cumsum", "cumsum"),
    (r"cumprod", "cumprod"),
    (r"scaleddotproductattention", "sdpa"),
    (r"gelu", "gelu"),
    (r"^(relu|leakyrelu|sigmoid|tanh|softmax|logsoftmax|swish|selu|hardsigmoid|softplus|softsign|elu|hardtanh|"
     r"batchnorm|instancenorm|groupnorm|rmsnorm|frobeniusnorm|l1norm|l2norm|layernorm|mseloss|crossentropyloss|"
     r"huberloss|kldivloss|tripletmarginloss|hingeloss)_?$", r"\1"),
]

# Traced op name, without its prefix (nn., F., torch., Tensor.) and lower-cased -> token.
# null: layout-only ops (views, copies) that are not part of the spelled sequence and are skipped.
# An op not listed keeps its own lower-cased name, so it cannot match by accident.
OP_TOKENS = {
    "conv2d": "conv2d", "conv3d": "conv3d", "conv1d": "conv1d",
    "convtranspose1d": "convtranspose1d", "conv_transpose1d": "convtranspose1d",
    "convtranspose2d": "convtranspose2d", "conv_transpose2d": "convtranspose2d",
    "convtranspose3d": "convtranspose3d", "conv_transpose3d": "convtranspose3d",
    "linear": "gemm", "matmul": "gemm", "mm": "gemm", "addmm": "gemm", "bmm": "bmm", "baddbmm": "bmm",
    "relu": "relu", "relu_": "relu", "leakyrelu": "leakyrelu", "leaky_relu": "leakyrelu",
    "gelu": "gelu", "mish": "mish", "tanh": "tanh", "sigmoid": "sigmoid", "silu": "swish",
    "hardswish": "hardswish", "hardtanh": "hardtanh", "softmax": "softmax", "logsumexp": "logsumexp",
    "add": "add", "add_": "add", "sub": "subtract", "sub_": "subtract", "subtract": "subtract",
    "mul": "multiply", "mul_": "multiply", "multiply": "multiply",
    "div": "divide", "div_": "divide", "divide": "divide",
    "clamp": "clamp", "clamp_": "clamp", "clip": "clamp",
    "sum": "sum", "mean": "mean", "max": "max", "amax": "max", "min": "min", "amin": "min",
    "maxpool1d": "maxpool", "maxpool2d": "maxpool", "maxpool3d": "maxpool",
    "max_pool1d": "maxpool", "max_pool2d": "maxpool", "max_pool3d": "maxpool",
    "avgpool1d": "avgpool", "avgpool2d": "avgpool", "avgpool3d": "avgpool",
    "avg_pool1d": "avgpool", "avg_pool2d": "avgpool", "avg_pool3d": "avgpool",
    "adaptiveavgpool1d": "globalavgpool", "adaptiveavgpool2d": "globalavgpool", "adaptiveavgpool3d": "globalavgpool",
    "adaptive_avg_pool1d": "globalavgpool", "adaptive_avg_pool2d": "globalavgpool",
    "adaptive_avg_pool3d": "globalavgpool",
    "batchnorm1d": "batchnorm", "batchnorm2d": "batchnorm", "batchnorm3d": "batchnorm", "batch_norm": "batchnorm",
    "groupnorm": "groupnorm", "group_norm": "groupnorm", "layernorm": "layernorm", "layer_norm": "layernorm",
    "instancenorm1d": "instancenorm", "instancenorm2d": "instancenorm", "instancenorm3d": "instancenorm",
    "instance_norm": "instancenorm", "dropout": "dropout",
    "logsoftmax": "logsoftmax", "log_softmax": "logsoftmax", "selu": "selu", "elu": "elu",
    "hardsigmoid": "hardsigmoid", "softplus": "softplus", "softsign": "softsign",
    "rmsnorm": "rmsnorm", "rms_norm": "rmsnorm", "cumsum": "cumsum", "cumprod": "cumprod",
    "argmax": "argmax", "argmin": "argmin", "mseloss": "mseloss", "mse_loss": "mseloss",
    "crossentropyloss": "crossentropyloss", "cross_entropy": "crossentropyloss",
    "huberloss": "huberloss", "huber_loss": "huberloss", "smoothl1loss": "huberloss", "smooth_l1_loss": "huberloss",
    "kldivloss": "kldivloss", "kl_div": "kldivloss", "tripletmarginloss": "tripletmarginloss",
    "triplet_margin_loss": "tripletmarginloss", "scaled_dot_product_attention": "sdpa",
    "view": None, "reshape": None, "flatten": None, "contiguous": None, "permute": None, "transpose": None,
    "squeeze": None, "unsqueeze": None, "expand": None, "expand_as": None, "clone": None,
    "__getitem__": None, "to": None, "float": None,
}


def level1_token(name):
    low = name.lower()
    for pattern, token in LEVEL1_RULES:
        m = re.search(pattern, low)
        if m:
            return m.expand(token)
    return None


def main(path):
    sequences, level1 = {}, {}
    for line in open(path, encoding="utf-8"):
        m = re.match(r"level([12])/(\d+)_(.+)\.py$", line.strip())
        if not m:
            continue
        name = f"{m.group(2)}_{m.group(3)}"
        if m.group(1) == "1":
            token = level1_token(m.group(3))
            if token is None:
                print(f"kernelbench_ops.py: no rule for level-1 problem {name}", file=sys.stderr)
            level1[name] = token
            continue
        words = [w.lower() for w in m.group(3).split("_") if w]
        sequences[name] = [NAME_SYNONYMS.get(w, w) for w in words]
    out = {
        "about": "KernelBench level-2 op sequences and level-1 ops from the problem names, and the map of traced "
                 "op names onto the same tokens. Generated by data/tools/kernelbench_ops.py; see data/README.md.",
        "level1": level1,
        "op_prefixes": ["nn.", "F.", "torch.", "Tensor."],
        "op_tokens": OP_TOKENS,
        "level2": sequences,
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
