"""Kernel names of both sides in ggml's vocabulary (graphdiag/llama/kernel_names.py)."""

from graphdiag.llama.kernel_names import first_difference, identifier, upstream, upstream_sequence


def test_llama_cpp_names_cut_to_ggml_identifiers():
    assert identifier("_Z13mul_mat_vec_fI6__halfS0_Li1ELi256ELb0ELb0EEvPKT_PKfPKi") == "mul_mat_vec_f"
    assert identifier("_Z9rope_normILb1ELb0EffEvPKT1_PT2_") == "rope" == identifier("rope_neox")
    assert identifier("_ZN7cutlass7Kernel2I50cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4EEvNT_6ParamsE") \
        == "cublas_gemm"
    assert identifier("_ZN8cublasLt19splitKreduce_kernelILi32ELi16EiffffLb0E") == "fixup"
    assert identifier("mul_mat_q_stream_k_fixup") == "fixup" and identifier("k_set_rows") == "k_set_rows"


def test_graphdiag_names_as_the_ggml_kernel_they_stand_for():
    assert [upstream(k) for k in ("mul_mat_vec_add_q8_0", "mul_mat_vec_glu_f16", "rms_norm_mul_f32",
                                  "rope_set_rows_f16", "set_rows_f16", "add_f32", "glu_swiglu_f32",
                                  "mul_mat_f32", "mul_mat_fixup_f32", "get_rows_q8_0", "nonesuch")] == [
        "mul_mat_vec_q", "mul_mat_vec_f", "rms_norm_f32", "rope", "k_set_rows", "k_bin_bcast",
        "unary_gated_op_kernel", "cublas_gemm", "fixup", "k_get_rows", "?nonesuch"]
    assert upstream_sequence(["flash_attn_mma_f16_d64", "flash_attn_combine_f32"]) == ["flash_attn_ext_f16", "fixup"]
    assert upstream_sequence(["flash_attn_vec_f16_d64_g1", "flash_attn_combine_f32"])[1] == \
        "flash_attn_combine_results"


def test_first_difference_leaves_out_the_embedding():
    ours = ["get_rows_f16", "rms_norm_mul_f32", "mul_mat_vec_f16"]
    assert first_difference(ours, ["rms_norm_f32", "_Z13mul_mat_vec_fIffEv"]) is None
    assert first_difference(ours, ["rms_norm_f32", "_Z9mul_mat_fIffEv"]) == (1, "mul_mat_vec_f", "mul_mat_f")
    assert first_difference(ours, ["rms_norm_f32"]) == (1, "mul_mat_vec_f", "")


def test_differences_name_every_position_not_only_the_first():
    from graphdiag.llama.kernel_names import KernelDifference, differences
    ours = ["get_rows_f16", "mul_mat_vec_f16", "rms_norm_f32", "mul_mat_vec_add_f16"]
    theirs = ["_Z9mul_mat_fIffEv", "rms_norm_f32", "_Z9mul_mat_fIffEv"]
    assert differences(ours, theirs) == [KernelDifference(0, "mul_mat_vec_f16", "mul_mat_vec_f", "mul_mat_f"),
                                         KernelDifference(2, "mul_mat_vec_add_f16", "mul_mat_vec_f", "mul_mat_f")]


def test_moe_kernels_name_the_upstream_path_they_stand_for():
    """ggml-cuda.cu ggml_cuda_mul_mat_id on NVIDIA: a float MUL_MAT_ID outside the fused gate/up runs MMF
    (mul_mat_f with ids; above 16 tokens mm_ids_helper + mul_mat_f_ids, mmf.cu ggml_cuda_mul_mat_f), quantized
    experts mmvq (mul_mat_vec_q, mul_mat_vec_q_moe above one token: mmvq.cu) or MMQ (mm_ids_helper,
    quantize_mmq_q8_1, mul_mat_q [+ its stream-k fixup]: mmq.cu ggml_cuda_mul_mat_q)."""
    assert [upstream(k) for k in ("mul_mat_id_vec_f16", "mul_mat_id_vec_bf16", "mul_mat_id_vec_glu_f16",
                                  "mul_mat_id_vec_q8_0", "mul_mat_id_vec_glu_q4_k", "mm_ids_helper",
                                  "mul_mat_id_q_q6_k", "mul_mat_id_f_bf16", "quantize_q8_1")] == [
        "mul_mat_f", "mul_mat_f", "mul_mat_vec_f", "mul_mat_vec_q", "mul_mat_vec_q", "mm_ids_helper", "mul_mat_q",
        "mul_mat_f_ids", "quantize"]
    assert [identifier(k) for k in ("_Z17mul_mat_vec_q_moeIL9ggml_type8ELi1ELb0EEvPKv", "_Z13mm_ids_helperILi2EEv",
                                    "_Z17quantize_mmq_q8_1IL22mmq_q8_1_ds_layout0ELb1EEv",
                                    "_Z13mul_mat_f_idsI7__half2Li32ELi16ELi4EEv")] == [
        "mul_mat_vec_q", "mm_ids_helper", "quantize", "mul_mat_f_ids"]


def test_a_first_kernel_that_is_not_the_embedding_is_a_difference():
    from graphdiag.llama.kernel_names import differences
    d = differences(["rms_norm_f32", "mul_mat_vec_f16"], ["_Z13mul_mat_vec_fIffEv"])
    assert [(x.index, x.kernel) for x in d] == [(-1, "rms_norm_f32")]


def test_the_qk_norm_fusion_is_its_own_family():
    """graphdiag's rms_norm_mul_rope (and its set_rows form) is ggml's fused rms_norm_mul_rope_f32 (qwen3,
    Gemma 3), not a rope (tests/data/llama/kernels-qwen3moe-f16-moe-sequences-sweep.json)."""
    assert upstream("rms_norm_mul_rope_f32") == upstream("rms_norm_mul_rope_set_rows_f16") == \
        identifier("_Z21rms_norm_mul_rope_f32ILi256EEvPKf") == "rms_norm_mul_rope_f32"


def test_f16_cublas_path_matches_graphdiags_copies_and_bf16_conversions_are_left_out():
    """llama.cpp's cuBLAS path for an F16 GEMM: convert x, the GEMM (here split over K, its reduce after),
    convert the result back — graphdiag launches the same (cpy_f32_f16, mul_mat_f16, mul_mat_fixup_f32,
    cpy_f16_f32: lowering._cublas_f16), so nothing is left out; an F32 GEMM (the MoE router's) has no
    conversion and stays cuBLAS's; x's conversion to BF16 before a BF16 GEMM is left out (graphdiag's
    mul_mat_bf16 reads F32 x) and the GEMM after it matched by graphdiag's tile kernel."""
    from graphdiag.llama.kernel_names import differences, without_cublas_conversions
    theirs = ["_Z12rms_norm_f32ILi256EEv", "_Z23convert_unary_cont_vec4If6__halfEvPKvPT0_l",
              "_ZN7cutlass7Kernel2I51cutlass_80_tensorop_h16816gemm_64x64_64x3_tn_align8EEvNT_6ParamsE",
              "_ZN8cublasLt19splitKreduce_kernelILi32ELi16Ei6__halfS1_S1_S1_Lb0EEEv",
              "_Z23convert_unary_cont_vec4I6__halffEvPKvPT0_l",
              "_ZN7cutlass7Kernel2I50cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4EEvNT_6ParamsE"]
    kept, gemms = without_cublas_conversions(theirs)
    assert kept == theirs and gemms == set()
    ours = ["get_rows_f16", "rms_norm_f32", "cpy_f32_f16", "mul_mat_f16", "mul_mat_fixup_f32", "cpy_f16_f32",
            "mul_mat_f32"]
    assert differences(ours, kept) == []
    # the tile kernel without x's copy before it is MMF's stand-in, not the GEMM: a difference
    assert [(d.index, d.ours) for d in differences(ours[:2] + ["rms_norm_f32"] + ours[3:], kept)][:2] == [
        (1, "rms_norm_f32"), (2, "mul_mat_f")]
    bf16 = ["_Z12rms_norm_f32ILi256EEv", "_Z23convert_unary_cont_vec4If14__nv_bfloat16EvPKvPT0_l",
            "_ZN7cutlass7Kernel2I52cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_32x6_tn_align8EEvNT_6ParamsE"]
    kept, gemms = without_cublas_conversions(bf16)
    assert len(kept) == 2 and gemms == {1}
    assert differences(["get_rows_bf16", "rms_norm_f32", "mul_mat_bf16"], kept, f16_gemms=gemms) == []


def test_a_dequantize_and_tile_mat_mul_stand_for_mmq():
    assert upstream_sequence(["dequantize_f16_q5_0", "mul_mat_f16", "mul_mat_f16", "scale_f32"]) == [
        "quantize", "mul_mat_q", "mul_mat_f", "scale_f32"]
