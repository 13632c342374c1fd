/* run_tests.c: the one test runner. Tests are a static table of (name,
 * function, needs); `run_tests NAME...` runs only the named ones,
 * `--gpu` only those that need a GPU, `--cpu-only` skips them,
 * `--no-subprocess` skips tests that run other programs (for valgrind).
 * A GPU test without a GPU is skipped with the probe's reason, or fails
 * when KVBENCH_REQUIRE_GPU=1. The last line is "N passed, N failed, N skipped". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops/kv_gpu.h"
#include "../retrievers/baselines.h"
#include "kv_test.h"

extern char kv_test_reason[512];

/* Each test_*.c defines its tests; declare and list them here. */
#define KV_TESTS(X)                                        \
    X(env_set_restores, 0)                                 \
    X(common_half_roundtrip, 0)                            \
    X(common_percentile, 0)                                \
    X(topk_ref_matches_sort, 0)                            \
    X(kth_largest_matches_sort, 0)                         \
    X(topk_kth_largest, 0)                                 \
    X(topk_routes_agree, 0)                                \
    X(params_validation, 0)                                \
    X(gpu_streams_blocking, 0)                             \
    X(loader_good_file, 0)                                 \
    X(loader_rejects_malformed, 0)                         \
    X(loader_float32_and_gzip, 0)                          \
    X(loader_parallel_matches_library, 0)                  \
    X(loader_parallel_all_halves, 0)                       \
    X(loader_float16_form, 0)                              \
    X(loader_string_attr_arrays, 0)                        \
    X(loader_long_paths, 0)                                \
    X(loader_resource_bombs, 0)                            \
    X(loader_types_and_names, KV_NEEDS_SUBPROCESS)         \
    X(loader_messages, 0)                                  \
    X(loader_corpus, 0)                                    \
    X(cli_corpus, KV_NEEDS_SUBPROCESS)                     \
    X(cli_fuzz_corpus, 0)                                  \
    X(synth_deterministic, 0)                              \
    X(exact_matches_brute_force, 0)                        \
    X(protocol_hand_case, 0)                               \
    X(protocol_rejects_contract_breaks, 0)                 \
    X(protocol_long_prefix_and_tail, 0)                    \
    X(conformance_all_methods, 0)                          \
    X(sampled_full_is_exact, 0)                            \
    X(sampled_topk_of_its_sample, 0)                       \
    X(freekv_tau_never_is_previous_step, 0)                \
    X(freekv_tau_always_is_current_step, 0)                \
    X(freekv_correction_fires_at_the_jump, 0)              \
    X(racc_vote_matches_direct, 0)                         \
    X(racc_resident_follows_alpha_and_ln, 0)               \
    X(racc_faiss_exhaustive_equals_exact, 0)               \
    X(racc_index_param_rejected, 0)                        \
    X(racc_retrieval_is_lag1_mips, 0)                      \
    X(pqcache_codes_are_nearest, 0)                        \
    X(pqcache_kmeans_lowers_error, 0)                      \
    X(pqcache_adc_matches_direct, 0)                       \
    X(quest_bound_is_upper_bound, 0)                       \
    X(quest_selects_top_pages, 0)                          \
    X(quest_partial_page_is_extra, 0)                      \
    X(magicpig_collisions_match_sign_bits, 0)              \
    X(magicpig_weight_hand_cases, 0)                       \
    X(magicpig_returns_colliding_keys, 0)                  \
    X(baselines_param_variants, 0)                         \
    X(pariskv_srht_orthogonal, 0)                          \
    X(pariskv_lloyd_max, 0)                                \
    X(pariskv_bf16_rounding, 0)                            \
    X(pariskv_rsqip_estimate, 0)                           \
    X(pariskv_collision_scores, 0)                         \
    X(pariskv_bucket_topk, 0)                              \
    X(pariskv_matches_exact, 0)                            \
    X(pariskv_stage1_brute_force, 0)                       \
    X(pariskv_update_buffer, 0)                            \
    X(pariskv_ablation_variants, 0)                        \
    X(csattention_kmeans_fixed_point, 0)                   \
    X(csattention_lists_are_top_l, 0)                      \
    X(csattention_reduce_matches_direct, 0)                \
    X(csattention_variants, 0)                             \
    X(ctkvr_positions, 0)                                  \
    X(ctkvr_lists_brute_force, 0)                          \
    X(ctkvr_union_matches_direct, 0)                       \
    X(ctkvr_all_centroids_is_exact, 0)                     \
    X(ctkvr_dcu_fifo, 0)                                   \
    X(faiss_flat_matches_exact, 0)                         \
    X(faiss_ivf_full_probe_is_exact, 0)                    \
    X(faiss_hnsw_ivfpq_recall, 0)                          \
    X(faiss_params_validated, 0)                           \
    X(gpu_scores_match_ref, KV_NEEDS_GPU)                  \
    X(run_memory_preflight_gpu, KV_NEEDS_GPU | KV_NEEDS_SUBPROCESS) \
    X(gpu_topk_matches_ref, KV_NEEDS_GPU)                  \
    X(gpu_oracle_matches_cpu, KV_NEEDS_GPU)                \
    X(gpu_exact_matches_cpu, KV_NEEDS_GPU)                 \
    X(gpu_oom_is_an_error, KV_NEEDS_GPU)                   \
    X(pariskv_gpu_encode_matches_cpu, KV_NEEDS_GPU)        \
    X(pariskv_gpu_search_matches_cpu, KV_NEEDS_GPU)        \
    X(pariskv_gpu_bucket_topk, KV_NEEDS_GPU)               \
    X(pariskv_gpu_retriever_matches_cpu, KV_NEEDS_GPU)     \
    X(magicpig_gpu_codes_match_cpu, KV_NEEDS_GPU)          \
    X(magicpig_gpu_matches_cpu, KV_NEEDS_GPU)              \
    X(pqcache_gpu_kmeans_matches_cpu, KV_NEEDS_GPU)        \
    X(pqcache_gpu_adc_matches_cpu, KV_NEEDS_GPU)           \
    X(pqcache_gpu_retriever_matches_cpu, KV_NEEDS_GPU)     \
    X(pqcache_gpu_tuple_topk_matches_ref, KV_NEEDS_GPU)    \
    X(quest_gpu_summaries_match_cpu, KV_NEEDS_GPU)         \
    X(quest_gpu_retriever_matches_cpu, KV_NEEDS_GPU)       \
    X(csattention_gpu_matches_cpu, KV_NEEDS_GPU)           \
    X(csattention_gpu_dense_matches_cpu, KV_NEEDS_GPU)     \
    X(csattention_gpu_sort_matches_cpu, KV_NEEDS_GPU)      \
    X(csattention_gpu_tiles_match_cpu, KV_NEEDS_GPU)       \
    X(csattention_gpu_pipelined_match_cpu, KV_NEEDS_GPU)   \
    X(csattention_gpu_bits_unsampled_match_cpu, KV_NEEDS_GPU) \
    X(csattention_gpu_bits_long_runs_match_cpu, KV_NEEDS_GPU) \
    X(csattention_gpu_bits_sampled_match_cpu, KV_NEEDS_GPU) \
    X(csattention_gpu_bits_pooled_match_cpu, KV_NEEDS_GPU) \
    X(csattention_gpu_bits_pooled_default_match_cpu, KV_NEEDS_GPU) \
    X(csattention_gpu_tile_variants_match_cpu, KV_NEEDS_GPU) \
    X(csattention_gpu_kmeans_matches_cpu, KV_NEEDS_GPU)    \
    X(ctkvr_gpu_matches_cpu, KV_NEEDS_GPU)                 \
    X(ctkvr_gpu_staged_matches_cpu, KV_NEEDS_GPU)          \
    X(ctkvr_gpu_fused_v1_matches_cpu, KV_NEEDS_GPU)        \
    X(ctkvr_gpu_v2_matches_cpu, KV_NEEDS_GPU)              \
    X(freekv_gpu_cosine_flags, KV_NEEDS_GPU)               \
    X(freekv_gpu_matches_cpu, KV_NEEDS_GPU)                \
    X(freekv_gpu_group_mean_pages, KV_NEEDS_GPU)           \
    X(racc_gpu_vote_matches_cpu, KV_NEEDS_GPU)             \
    X(racc_gpu_matches_cpu, KV_NEEDS_GPU)                  \
    X(cli_errors, KV_NEEDS_SUBPROCESS)                     \
    X(run_memory_preflight, KV_NEEDS_SUBPROCESS)           \
    X(run_results_loader_invariant, KV_NEEDS_SUBPROCESS)   \
    X(run_layer_form_invariant, KV_NEEDS_SUBPROCESS)       \
    X(run_memory_largest_context, 0)                       \
    X(run_layer_form_invariant_gpu, KV_NEEDS_GPU | KV_NEEDS_SUBPROCESS) \
    X(prefill_half_equals_float32, 0)                      \
    X(prefill_half_equals_float32_gpu, KV_NEEDS_GPU)       \
    X(cli_slice_roundtrip, KV_NEEDS_SUBPROCESS)            \
    X(cli_bench_cpu, KV_NEEDS_SUBPROCESS)                  \
    X(e2e_demo_trace, KV_NEEDS_SUBPROCESS)                 \
    X(results_atomic_on_failure, KV_NEEDS_SUBPROCESS)      \
    X(ablate_script, KV_NEEDS_SUBPROCESS)                  \
    X(oracle_nonfinite_scores, 0)                          \
    X(profile_hand_case, 0)                                \
    X(profile_brute_force, 0)                              \
    X(profile_long_regions, 0)                             \
    X(gpu_oracle_multi_k_profile_matches_cpu, KV_NEEDS_GPU) \
    X(gpu_oracle_profile_long_regions, KV_NEEDS_GPU)       \
    X(gpu_protocol_diag_matches_host, KV_NEEDS_GPU)        \
    X(run_multi_k_layer_seed_equals_single, KV_NEEDS_SUBPROCESS) \
    X(sweep_script, KV_NEEDS_SUBPROCESS)                   \
    X(run_golden_cpu, KV_NEEDS_SUBPROCESS)                 \
    X(run_golden_gpu, KV_NEEDS_GPU | KV_NEEDS_SUBPROCESS)  \
    X(run_queued_equals_sync_gpu, KV_NEEDS_GPU | KV_NEEDS_SUBPROCESS) \
    X(sweep_slurm_array, KV_NEEDS_SUBPROCESS)              \
    X(pareto_front_hand_case, KV_NEEDS_SUBPROCESS)         \
    X(gpu_oracle_nonfinite_scores, KV_NEEDS_GPU)           \
    X(cli_option_errors, KV_NEEDS_SUBPROCESS)              \
    X(cli_help_and_info, KV_NEEDS_SUBPROCESS)              \
    X(cli_build_failure_message, KV_NEEDS_SUBPROCESS)      \
    X(cli_k_above_context, KV_NEEDS_SUBPROCESS)            \
    X(cli_force_rule, KV_NEEDS_SUBPROCESS)                 \
    X(cli_out_checked_first, KV_NEEDS_SUBPROCESS)          \
    X(cli_nonfinite_scores, KV_NEEDS_SUBPROCESS)           \
    X(results_force_all_or_nothing, KV_NEEDS_SUBPROCESS)   \
    X(results_json_non_utf8, KV_NEEDS_SUBPROCESS)          \
    X(synth_signal_cleanup, KV_NEEDS_SUBPROCESS)           \
    X(method_group_flag_truthful, 0)                       \
    X(list_and_summary_report_granularity, KV_NEEDS_SUBPROCESS) \
    X(run_records_host, KV_NEEDS_SUBPROCESS)               \
    X(bench_cpu_defaults_fit_a_laptop, KV_NEEDS_SUBPROCESS) \
    X(binary_needs_no_cuda_libraries, KV_NEEDS_SUBPROCESS) \
    X(run_traces_keyed_by_config, KV_NEEDS_SUBPROCESS)     \
    X(readme_agrees_with_program, KV_NEEDS_SUBPROCESS)     \
    X(plots_style_and_errors, KV_NEEDS_SUBPROCESS | KV_NEEDS_PYTHON) \
    X(lag0_equals_normal_run, KV_NEEDS_SUBPROCESS)         \
    X(lag_shows_query_of_t_minus_d, KV_NEEDS_SUBPROCESS)   \
    X(dump_trace_tiny_models, KV_NEEDS_SUBPROCESS | KV_NEEDS_PYTHON)

#define KV_DECLARE(name, needs) int test_##name(void);
KV_TESTS(KV_DECLARE)
#define KV_ENTRY(name, needs) {#name, test_##name, needs},
static const kv_test tests[] = {KV_TESTS(KV_ENTRY)};

int main(int argc, char **argv) {
    int gpu_only = 0, cpu_only = 0, no_sub = 0, n_names = 0;
    const char *names[64];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gpu")) gpu_only = 1;
        else if (!strcmp(argv[i], "--cpu-only")) cpu_only = 1;
        else if (!strcmp(argv[i], "--no-subprocess")) no_sub = 1;
        else if (!strcmp(argv[i], "--list")) {
            for (size_t t = 0; t < sizeof tests / sizeof tests[0]; t++) puts(tests[t].name);
            return 0;
        } else if (n_names < 64) names[n_names++] = argv[i];
    }
    kv_faiss_quiet(1); /* the tests train Faiss on small prefills on purpose: no "too few training points" */
    int require_gpu = getenv("KVBENCH_REQUIRE_GPU") && !strcmp(getenv("KVBENCH_REQUIRE_GPU"), "1");
    int passed = 0, failed = 0, skipped = 0;
    for (size_t t = 0; t < sizeof tests / sizeof tests[0]; t++) {
        const kv_test *T = &tests[t];
        int want = !n_names;
        for (int j = 0; j < n_names; j++) want |= !strcmp(names[j], T->name);
        if (!want) continue;
        if (gpu_only && !(T->needs & KV_NEEDS_GPU)) continue;
        kv_test_reason[0] = 0;
        int rc;
        if (cpu_only && (T->needs & KV_NEEDS_GPU)) { rc = KV_TEST_SKIP; kv_test_skip_reason("--cpu-only"); }
        else if (no_sub && (T->needs & KV_NEEDS_SUBPROCESS)) { rc = KV_TEST_SKIP; kv_test_skip_reason("--no-subprocess"); }
        else if ((T->needs & KV_NEEDS_GPU) && !kv_test_have_gpu()) rc = require_gpu ? KV_TEST_FAIL : KV_TEST_SKIP;
        else {
            double t0 = kv_now();
            rc = T->fn();
            if (rc == KV_TEST_SKIP && require_gpu && (T->needs & KV_NEEDS_GPU)) rc = KV_TEST_FAIL;
            if (rc != KV_TEST_SKIP) printf("%-36s %s  (%.2fs)\n", T->name, rc == KV_TEST_PASS ? "ok" : "FAIL", kv_now() - t0);
        }
        if (rc == KV_TEST_SKIP) printf("%-36s skipped: %s\n", T->name, kv_test_reason[0] ? kv_test_reason : "(no reason)");
        else if (rc == KV_TEST_FAIL && (T->needs & KV_NEEDS_GPU) && kv_test_reason[0]) printf("%-36s FAIL: %s\n", T->name, kv_test_reason);
        fflush(stdout);
        passed += rc == KV_TEST_PASS;
        failed += rc == KV_TEST_FAIL;
        skipped += rc == KV_TEST_SKIP;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
