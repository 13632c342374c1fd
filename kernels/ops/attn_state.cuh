/* attn_state.cuh: the GPU oracle's object (kv_gpu_attn of kv_gpu.h), shared
 * by attention.cu (the step: scores, threshold, softmax + PV) and
 * attn_eval.cu (issue 12: the several-budget thresholds and the budget
 * profile from a device sort, and the protocol's per-method diagnostics),
 * so the evaluation reads the step's scores, V and results where they are. */
#ifndef KV_ATTN_STATE_CUH
#define KV_ATTN_STATE_CUH

#include "kv_cuda.h"

/* One diagnostics slot (a method record): packed lists in, rows out. */
typedef struct {
    uint32_t *hin, *din;   /* pinned / device packed lists (kv_gpu_attn_diag) */
    size_t cap;            /* words of hin and din */
    kv_gpu_diag_row *drow, *hrow; /* [Hq] device / pinned */
    int pending;           /* packed, not launched yet (kv_gpu_attn_diag_flush launches it) */
    int held;              /* packed and not taken yet (kv_gpu_attn_diag_take) */
    int N, kk, split, has_cand, b, t;
    float metric;
    size_t words;
    size_t att_off, lw_off, flg_off, cand_off; /* where each part of hin starts (words; lw_off 0: no log-weights) */
    const int32_t *dc;     /* device candidates (kv_gpu_diag_in.dcidx), or NULL: packed in hin */
    long long dld;
    int dmap, dcount;      /* dcount -1: list lengths from the packed candidate offsets (dcounts) */
    int dcmax;             /* the longest list */
    int32_t *dcopy;        /* device: their copy when several budgets search in a step */
    size_t dcopy_cap;      /* ints */
    unsigned *chits;       /* device [Hq + 1]: candidate hits per head, then a position out of range */
} kv_attn_slot;

struct kv_gpu_attn {
    int Hq, Hkv, T, D, n_last;
    kv_cuda_dev dev;
    kv_gpu_keys *K, *V;
    float *q, *S, *res, *hq, *hres, *gout, *hout;
    float *hS; /* [Hq][T] pinned: kv_gpu_attn_scores (allocated on first use) */
    uint32_t *gpos, *hpos;
    unsigned *cnt, *hcnt; /* [2][Hq]: top-k members by key origin */
    kv_topk_ws tk;
    kv_pv_ws pv;
    cudaStream_t st;
    /* several budgets and the profile (kv_gpu_attn_multi) */
    int ev_nk, ev_profile, ev_hbits;
    int *ev_ks;                       /* device [nk] */
    unsigned long long *ev_key, *ev_key2; /* device [Hq][T]: (head, descending score key), sorted */
    void *ev_tmp;                     /* the sort's temporary storage */
    size_t ev_tmp_bytes;
    uint32_t *ev_res, *ev_hres;       /* [nk][Hq] thr, [nk][2][Hq] counts, at word ev_cross_w [Hq][5] crossings */
    size_t ev_words, ev_cross_w;
    double *ev_part;                  /* device [Hq][EV_NB]: the profile's per-block sums */
    /* the protocol's diagnostics (kv_gpu_attn_diag) */
    int n_slots;
    kv_attn_slot *slots;
    kv_gpu_diag_row *drows, *hrows; /* [n_slots][Hq] device / pinned: every slot's rows, one download */
    void *hpar, *dpar;               /* [n_slots] launch parameters (attn_eval.cu), pinned / device */
    unsigned *dchits;                /* device [n_slots][Hq + 1]: the slots' chits */
    int ev_vstage;                   /* the diagnostics stage value rows in shared memory (attn_eval.cu ev_vstage;
                                        KVBENCH_EV_VSTAGE=0: off) */
    /* device time (CUDA events on the stream): [0, 1] a step, [2, 3] its evaluation, [4, 5] a flush of the
     * diagnostics (read at the next wait); seconds summed (kv_gpu_attn_times) */
    cudaEvent_t ev[6];
    int ev_ready, diag_timed;
    double t_step, t_eval, t_diag;
};

/* Adds the milliseconds between two completed events of the oracle, in seconds, to *acc. */
static inline void kv_attn_ev_add(kv_gpu_attn *a, int e0, int e1, double *acc) {
    float ms = 0;
    if (!a->ev_ready) return;
    if (cudaEventElapsedTime(&ms, a->ev[e0], a->ev[e1]) == cudaSuccess) *acc += ms / 1e3;
    else (void)cudaGetLastError(); /* a timing is optional: never leave its error for a launch check to find */
}

#endif
