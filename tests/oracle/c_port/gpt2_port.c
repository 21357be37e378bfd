// gpt2_port.c: a float32 GPT-2, forward and backward, in plain sequential loops.
//
// A port as a C programmer writes one (the style of llm.c's CPU code, written for refgpt's tests,
// not copied from it): one float accumulator per dot product and per sum, LayerNorm and softmax
// from one float32 mean, variance and sum per row, the loss's gradient from the float32 softmax.
// refgpt's oracle must pass it at every optimisation level (tests/oracle/test_c_port.py).
//
//   gpt2_port MODEL.bin STATE.bin OUT.bin
//   gpt2_port MODEL.bin STATE.bin OUT_DIR --generate N
//
// MODEL: an llm.c checkpoint (float32, version 3). STATE: an llm.c debug state, of which the
// batch x and targets y are read. OUT: refgpt's llm.c dump (refgpt/oracle/llmc_dump.py): the
// inputs, targets, mean loss, and the activations, parameter gradients and activation gradients
// in llm.c's buffer layouts. With --generate N, x is a prompt, greedily continued by N tokens as
// llm.c's generation loop does it: every step runs the whole forward pass over T = prompt + N − 1
// positions (those not yet generated hold token V − 1) and takes the arg-max of the newest
// position's logits; each step's acts_memory is written to OUT_DIR/step{S}.bin.
//
// Build-time choices:
//   -DORDER=0   every dot product and sum in index order (default)
//   -DORDER=1   in reverse index order
//   -DORDER=2   in 8 interleaved partial sums, added pairwise at the end (a SIMD reduction)
//   -DBUG_GELU_PI            gelu_forward with sqrt(2/3.14) (a planted forward bug)
//   -DBUG_GELU_BACKWARD      gelu_backward without the 3 of d(x^3)/dx (a planted backward bug)
//   -DBUG_SOFTMAX_PADDED     the vocabulary softmax over the padded vocabulary (a planted bug)
//   -DBUG_LN_BACKWARD_MEAN   layernorm_backward without its mean term (a planted bug)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ORDER
#define ORDER 0
#endif

// ---- sums, in the order chosen at build time ----------------------------------------------------

static float dot(const float *a, const float *b, int n, float start) {
#if ORDER == 0
    float s = start;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
#elif ORDER == 1
    float s = start;
    for (int i = n - 1; i >= 0; i--) s += a[i] * b[i];
    return s;
#else
    float p[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) p[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++) p[k] += a[i] * b[i];
    return start + (((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])));
#endif
}

static float total(const float *a, int n) {  // Σ a[i]
#if ORDER == 0
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i];
    return s;
#elif ORDER == 1
    float s = 0.0f;
    for (int i = n - 1; i >= 0; i--) s += a[i];
    return s;
#else
    float p[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) p[k] += a[i + k];
    for (int k = 0; i < n; i++, k++) p[k] += a[i];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
#endif
}

// ---- the model's buffers, in llm.c's layouts ------------------------------------------------------

enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB,
       LNFW, LNFB, N_PARAMS };
enum { ENCODED, LN1, LN1_MEAN, LN1_RSTD, QKV, ATTY, PREATT, ATT, ATTPROJ, RESIDUAL2, LN2, LN2_MEAN,
       LN2_RSTD, FCH, FCH_GELU, FCPROJ, RESIDUAL3, LNF, LNF_MEAN, LNF_RSTD, LOGITS, PROBS, LOSSES, N_ACTS };

typedef struct {
    int maxT, V, Vp, L, NH, C, B, T;
    size_t param_size[N_PARAMS], act_size[N_ACTS], n_params, n_acts;
    float *params, *grads, *acts, *grads_acts;
    float *p[N_PARAMS], *g[N_PARAMS], *a[N_ACTS], *ga[N_ACTS];
    int *inputs, *targets;
    float mean_loss;
} Port;

static void *checked(void *p) {
    if (!p) { fprintf(stderr, "gpt2_port: out of memory\n"); exit(1); }
    return p;
}

static void point(float *base, const size_t *sizes, int n, float **out) {
    for (int i = 0; i < n; i++) { out[i] = base; base += sizes[i]; }
}

static void read_exactly(void *dst, size_t size, size_t n, FILE *f, const char *what) {
    if (fread(dst, size, n, f) != n) { fprintf(stderr, "gpt2_port: %s: short read\n", what); exit(1); }
}

static void load(Port *m, const char *model_path, const char *state_path, int extra) {
    int h[256];
    FILE *f = fopen(model_path, "rb");
    if (!f) { fprintf(stderr, "gpt2_port: cannot open %s\n", model_path); exit(1); }
    read_exactly(h, sizeof(int), 256, f, model_path);
    if (h[0] != 20240326 || h[1] != 3) { fprintf(stderr, "gpt2_port: %s: not a float32 llm.c checkpoint\n", model_path); exit(1); }
    m->maxT = h[2]; m->V = h[3]; m->L = h[4]; m->NH = h[5]; m->C = h[6]; m->Vp = h[7];
    size_t C = m->C, L = m->L, Vp = m->Vp;
    size_t ps[N_PARAMS] = {Vp * C, m->maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                           L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
    memcpy(m->param_size, ps, sizeof ps);
    m->n_params = 0;
    for (int i = 0; i < N_PARAMS; i++) m->n_params += ps[i];
    m->params = checked(malloc(m->n_params * sizeof(float)));
    read_exactly(m->params, sizeof(float), m->n_params, f, model_path);
    fclose(f);
    point(m->params, m->param_size, N_PARAMS, m->p);

    f = fopen(state_path, "rb");
    if (!f) { fprintf(stderr, "gpt2_port: cannot open %s\n", state_path); exit(1); }
    read_exactly(h, sizeof(int), 256, f, state_path);
    if (h[0] != 20240327) { fprintf(stderr, "gpt2_port: %s: not an llm.c debug state\n", state_path); exit(1); }
    int T0 = h[3];
    m->B = h[2]; m->T = T0 + extra;
    size_t BT = (size_t)m->B * m->T, B = m->B, T = m->T, NH = m->NH;
    m->inputs = checked(malloc(BT * sizeof(int)));
    m->targets = checked(malloc(BT * sizeof(int)));
    for (size_t i = 0; i < BT; i++) m->inputs[i] = m->targets[i] = m->V - 1;
    for (size_t b = 0; b < B; b++) read_exactly(m->inputs + b * T, sizeof(int), T0, f, state_path);
    for (size_t b = 0; b < B; b++) read_exactly(m->targets + b * T, sizeof(int), T0, f, state_path);
    fclose(f);
    size_t as[N_ACTS] = {BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C, L * B * NH * T * T,
                         L * B * NH * T * T, L * BT * C, L * BT * C, L * BT * C, L * BT, L * BT, L * BT * 4 * C,
                         L * BT * 4 * C, L * BT * C, L * BT * C, BT * C, BT, BT, BT * Vp, BT * Vp, BT};
    memcpy(m->act_size, as, sizeof as);
    m->n_acts = 0;
    for (int i = 0; i < N_ACTS; i++) m->n_acts += as[i];
    m->acts = checked(calloc(m->n_acts, sizeof(float)));
    m->grads_acts = checked(calloc(m->n_acts, sizeof(float)));
    m->grads = checked(calloc(m->n_params, sizeof(float)));
    point(m->acts, m->act_size, N_ACTS, m->a);
    point(m->grads_acts, m->act_size, N_ACTS, m->ga);
    point(m->grads, m->param_size, N_PARAMS, m->g);
}

// ---- forward ------------------------------------------------------------------------------------

static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)inp[b * T + t] * C, *p = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
        }
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *bias, int BT, int C, float *scratch) {
    for (int r = 0; r < BT; r++) {
        const float *x = inp + (size_t)r * C;
        float m = total(x, C) / C;
        for (int i = 0; i < C; i++) scratch[i] = (x[i] - m) * (x[i] - m);
        float v = total(scratch, C) / C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        float *o = out + (size_t)r * C;
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + bias[i];
        mean[r] = m;
        rstd[r] = s;
    }
}

// out [BT, OC] = inp [BT, C] · weightᵀ (weight [OC, C]) + bias
static void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int BT, int C, int OC) {
    for (int r = 0; r < BT; r++)
        for (int o = 0; o < OC; o++)
            out[(size_t)r * OC + o] = dot(inp + (size_t)r * C, weight + (size_t)o * C, C, bias ? bias[o] : 0.0f);
}

static void attention_forward(float *out, float *preatt, float *att, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float *pre = preatt + (((size_t)b * NH + h) * T + t) * T;
                float *p = att + (((size_t)b * NH + h) * T + t) * T;
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    pre[t2] = dot(q, k, hs, 0.0f) * scale;
                    if (pre[t2] > maxval) maxval = pre[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) p[t2] = expf(pre[t2] - maxval);
                float inv = 1.0f / total(p, t + 1);
                for (int t2 = 0; t2 < T; t2++) p[t2] = t2 <= t ? p[t2] * inv : 0.0f;
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += p[t2] * v[i];
                }
            }
}

#ifdef BUG_GELU_PI
#define GELU_SCALE sqrtf(2.0f / 3.14f)
#else
#define GELU_SCALE sqrtf(2.0f / (float)M_PI)
#endif

static void gelu_forward(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

static void residual_forward(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void softmax_forward(float *probs, const float *logits, int BT, int V, int Vp) {
#ifdef BUG_SOFTMAX_PADDED
    int n = Vp;
#else
    int n = V;
#endif
    for (int r = 0; r < BT; r++) {
        const float *x = logits + (size_t)r * Vp;
        float *p = probs + (size_t)r * Vp;
        float maxval = -INFINITY;
        for (int i = 0; i < n; i++) if (x[i] > maxval) maxval = x[i];
        for (int i = 0; i < n; i++) p[i] = expf(x[i] - maxval);
        float sum = total(p, n);
        for (int i = 0; i < Vp; i++) p[i] = i < V ? p[i] / sum : 0.0f;
    }
}

static void forward(Port *m, float *scratch) {
    int B = m->B, T = m->T, C = m->C, NH = m->NH, L = m->L, V = m->V, Vp = m->Vp, BT = B * T;
    float **a = m->a, **p = m->p;
    encoder_forward(a[ENCODED], m->inputs, p[WTE], p[WPE], B, T, C);
    for (int l = 0; l < L; l++) {
        size_t bc = (size_t)l * BT * C;
        const float *resid = l == 0 ? a[ENCODED] : a[RESIDUAL3] + bc - (size_t)BT * C;
        layernorm_forward(a[LN1] + bc, a[LN1_MEAN] + l * BT, a[LN1_RSTD] + l * BT, resid, p[LN1W] + l * C,
                          p[LN1B] + l * C, BT, C, scratch);
        matmul_forward(a[QKV] + 3 * bc, a[LN1] + bc, p[QKVW] + (size_t)l * 3 * C * C, p[QKVB] + l * 3 * C, BT, C, 3 * C);
        size_t att = (size_t)l * B * NH * T * T;
        attention_forward(a[ATTY] + bc, a[PREATT] + att, a[ATT] + att, a[QKV] + 3 * bc, B, T, C, NH);
        matmul_forward(a[ATTPROJ] + bc, a[ATTY] + bc, p[ATTPROJW] + (size_t)l * C * C, p[ATTPROJB] + l * C, BT, C, C);
        residual_forward(a[RESIDUAL2] + bc, resid, a[ATTPROJ] + bc, (size_t)BT * C);
        layernorm_forward(a[LN2] + bc, a[LN2_MEAN] + l * BT, a[LN2_RSTD] + l * BT, a[RESIDUAL2] + bc, p[LN2W] + l * C,
                          p[LN2B] + l * C, BT, C, scratch);
        matmul_forward(a[FCH] + 4 * bc, a[LN2] + bc, p[FCW] + (size_t)l * 4 * C * C, p[FCB] + l * 4 * C, BT, C, 4 * C);
        gelu_forward(a[FCH_GELU] + 4 * bc, a[FCH] + 4 * bc, (size_t)BT * 4 * C);
        matmul_forward(a[FCPROJ] + bc, a[FCH_GELU] + 4 * bc, p[FCPROJW] + (size_t)l * 4 * C * C, p[FCPROJB] + l * C,
                       BT, 4 * C, C);
        residual_forward(a[RESIDUAL3] + bc, a[RESIDUAL2] + bc, a[FCPROJ] + bc, (size_t)BT * C);
    }
    layernorm_forward(a[LNF], a[LNF_MEAN], a[LNF_RSTD], a[RESIDUAL3] + (size_t)(L - 1) * BT * C, p[LNFW], p[LNFB],
                      BT, C, scratch);
    matmul_forward(a[LOGITS], a[LNF], p[WTE], NULL, BT, C, Vp);
    softmax_forward(a[PROBS], a[LOGITS], BT, V, Vp);
    for (int r = 0; r < BT; r++) a[LOSSES][r] = -logf(a[PROBS][(size_t)r * Vp + m->targets[r]]);
    m->mean_loss = total(a[LOSSES], BT) / BT;
}

// ---- backward -----------------------------------------------------------------------------------

static void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int BT, int C, int OC, float *scratch) {
    for (int r = 0; r < BT; r++) {  // dinp[r, i] += Σ_o weight[o, i]·dout[r, o], over o in order
        float *di = dinp + (size_t)r * C;
        const float *d = dout + (size_t)r * OC;
        for (int o = 0; o < OC; o++) {
            const float *w = weight + (size_t)o * C;
            for (int i = 0; i < C; i++) di[i] += w[i] * d[o];
        }
    }
    for (int o = 0; o < OC; o++) {  // dweight[o, i] += Σ_r inp[r, i]·dout[r, o], over r in order
        float *dw = dweight + (size_t)o * C;
        for (int r = 0; r < BT; r++) {
            float d = dout[(size_t)r * OC + o];
            const float *x = inp + (size_t)r * C;
            for (int i = 0; i < C; i++) dw[i] += x[i] * d;
        }
        if (dbias) {
            for (int r = 0; r < BT; r++) scratch[r] = dout[(size_t)r * OC + o];
            dbias[o] += total(scratch, BT);
        }
    }
}

static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int BT, int C, float *scratch) {
    float *norm = scratch, *terms = scratch + C;
    for (int r = 0; r < BT; r++) {
        const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
        for (int i = 0; i < C; i++) norm[i] = (x[i] - mean[r]) * rstd[r];
        for (int i = 0; i < C; i++) terms[i] = w[i] * d[i];
        float dnorm_mean = total(terms, C) / C;
        for (int i = 0; i < C; i++) terms[i] = w[i] * d[i] * norm[i];
        float dnorm_norm_mean = total(terms, C) / C;
#ifdef BUG_LN_BACKWARD_MEAN
        dnorm_mean = 0.0f;
#endif
        float *di = dinp + (size_t)r * C;
        for (int i = 0; i < C; i++) {
            dbias[i] += d[i];
            dweight[i] += norm[i] * d[i];
            di[i] += (w[i] * d[i] - dnorm_mean - norm[i] * dnorm_norm_mean) * rstd[r];
        }
    }
}

static void attention_backward(float *dqkv, float *dpreatt, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *p = att + (((size_t)b * NH + h) * T + t) * T;
                float *dp = datt + (((size_t)b * NH + h) * T + t) * T;
                float *dpre = dpreatt + (((size_t)b * NH + h) * T + t) * T;
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                const float *d = dout + ((size_t)b * T + t) * C + h * hs;
                for (int t2 = 0; t2 <= t; t2++) {  // out = Σ att·v
                    const float *v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    float *dv = dqkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    dp[t2] = dot(v, d, hs, 0.0f);
                    for (int i = 0; i < hs; i++) dv[i] += p[t2] * d[i];
                }
                float weighted = dot(p, dp, t + 1, 0.0f);  // Σ att·datt
                for (int t2 = 0; t2 <= t; t2++) dpre[t2] = p[t2] * (dp[t2] - weighted);  // the softmax
                for (int t2 = 0; t2 <= t; t2++) {  // pre = q·k·scale
                    const float *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    float *dk = dqkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += dpre[t2] * scale * k[i];
                        dk[i] += dpre[t2] * scale * q[i];
                    }
                }
            }
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], s = GELU_SCALE;
        float t = tanhf(s * (x + 0.044715f * x * x * x));
#ifdef BUG_GELU_BACKWARD
        float du = s * (1.0f + 0.044715f * x * x);
#else
        float du = s * (1.0f + 3.0f * 0.044715f * x * x);
#endif
        dinp[i] += (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * dout[i];
    }
}

static void residual_backward(float *da, float *db, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) { da[i] += dout[i]; db[i] += dout[i]; }
}

static void backward(Port *m, float *scratch) {
    int B = m->B, T = m->T, C = m->C, NH = m->NH, L = m->L, V = m->V, Vp = m->Vp, BT = B * T;
    float **a = m->a, **p = m->p, **g = m->g, **ga = m->ga;
    float dloss = 1.0f / BT;  // mean loss over B·T positions
    for (int r = 0; r < BT; r++) {  // the softmax cross-entropy's gradient, from the float32 probs
        const float *pr = a[PROBS] + (size_t)r * Vp;
        float *dl = ga[LOGITS] + (size_t)r * Vp;
        for (int i = 0; i < V; i++) dl[i] = (pr[i] - (i == m->targets[r] ? 1.0f : 0.0f)) * dloss;
    }
    matmul_backward(ga[LNF], g[WTE], NULL, ga[LOGITS], a[LNF], p[WTE], BT, C, Vp, scratch);
    float *last = a[RESIDUAL3] + (size_t)(L - 1) * BT * C, *dlast = ga[RESIDUAL3] + (size_t)(L - 1) * BT * C;
    layernorm_backward(dlast, g[LNFW], g[LNFB], ga[LNF], last, p[LNFW], a[LNF_MEAN], a[LNF_RSTD], BT, C, scratch);
    for (int l = L - 1; l >= 0; l--) {
        size_t bc = (size_t)l * BT * C, att = (size_t)l * B * NH * T * T;
        const float *resid = l == 0 ? a[ENCODED] : a[RESIDUAL3] + bc - (size_t)BT * C;
        float *dresid = l == 0 ? ga[ENCODED] : ga[RESIDUAL3] + bc - (size_t)BT * C;
        residual_backward(ga[RESIDUAL2] + bc, ga[FCPROJ] + bc, ga[RESIDUAL3] + bc, (size_t)BT * C);
        matmul_backward(ga[FCH_GELU] + 4 * bc, g[FCPROJW] + (size_t)l * 4 * C * C, g[FCPROJB] + l * C, ga[FCPROJ] + bc,
                        a[FCH_GELU] + 4 * bc, p[FCPROJW] + (size_t)l * 4 * C * C, BT, 4 * C, C, scratch);
        gelu_backward(ga[FCH] + 4 * bc, a[FCH] + 4 * bc, ga[FCH_GELU] + 4 * bc, (size_t)BT * 4 * C);
        matmul_backward(ga[LN2] + bc, g[FCW] + (size_t)l * 4 * C * C, g[FCB] + l * 4 * C, ga[FCH] + 4 * bc,
                        a[LN2] + bc, p[FCW] + (size_t)l * 4 * C * C, BT, C, 4 * C, scratch);
        layernorm_backward(ga[RESIDUAL2] + bc, g[LN2W] + l * C, g[LN2B] + l * C, ga[LN2] + bc, a[RESIDUAL2] + bc,
                           p[LN2W] + l * C, a[LN2_MEAN] + l * BT, a[LN2_RSTD] + l * BT, BT, C, scratch);
        residual_backward(dresid, ga[ATTPROJ] + bc, ga[RESIDUAL2] + bc, (size_t)BT * C);
        matmul_backward(ga[ATTY] + bc, g[ATTPROJW] + (size_t)l * C * C, g[ATTPROJB] + l * C, ga[ATTPROJ] + bc,
                        a[ATTY] + bc, p[ATTPROJW] + (size_t)l * C * C, BT, C, C, scratch);
        attention_backward(ga[QKV] + 3 * bc, ga[PREATT] + att, ga[ATT] + att, ga[ATTY] + bc, a[QKV] + 3 * bc,
                           a[ATT] + att, B, T, C, NH);
        matmul_backward(ga[LN1] + bc, g[QKVW] + (size_t)l * 3 * C * C, g[QKVB] + l * 3 * C, ga[QKV] + 3 * bc,
                        a[LN1] + bc, p[QKVW] + (size_t)l * 3 * C * C, BT, C, 3 * C, scratch);
        layernorm_backward(dresid, g[LN1W] + l * C, g[LN1B] + l * C, ga[LN1] + bc, resid, p[LN1W] + l * C,
                           a[LN1_MEAN] + l * BT, a[LN1_RSTD] + l * BT, BT, C, scratch);
    }
    for (int b = 0; b < B; b++)  // the embeddings: a scatter-add
        for (int t = 0; t < T; t++) {
            const float *d = ga[ENCODED] + ((size_t)b * T + t) * C;
            float *dwte = g[WTE] + (size_t)m->inputs[b * T + t] * C, *dwpe = g[WPE] + (size_t)t * C;
            for (int i = 0; i < C; i++) { dwte[i] += d[i]; dwpe[i] += d[i]; }
        }
}

// ---- the dump -----------------------------------------------------------------------------------

static void dump(const Port *m, const char *path) {  // refgpt's llm.c dump, magic 20240416
    int h[256] = {0}, BT = m->B * m->T;
    h[0] = 20240416; h[1] = 1; h[2] = m->B; h[3] = m->T; h[4] = m->Vp; h[5] = 1; h[6] = 1; h[7] = 1;
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "gpt2_port: cannot write %s\n", path); exit(1); }
    fwrite(h, sizeof(int), 256, f);
    fwrite(m->inputs, sizeof(int), BT, f);
    fwrite(m->targets, sizeof(int), BT, f);
    fwrite(&m->mean_loss, sizeof(float), 1, f);
    fwrite(m->acts, sizeof(float), m->n_acts, f);
    fwrite(m->grads, sizeof(float), m->n_params, f);
    fwrite(m->grads_acts, sizeof(float), m->n_acts, f);
    if (fclose(f) != 0) { fprintf(stderr, "gpt2_port: cannot write %s\n", path); exit(1); }
}

static void generate(Port *m, int steps, const char *dir, float *scratch) {
    int prompt = m->T - (steps - 1);
    for (int S = 0; S < steps; S++) {
        forward(m, scratch);
        int pos = prompt + S - 1;  // the newest position
        for (int b = 0; b < m->B; b++) {
            const float *x = m->a[LOGITS] + ((size_t)b * m->T + pos) * m->Vp;
            int best = 0;
            for (int i = 1; i < m->V; i++) if (x[i] > x[best]) best = i;  // ties: the lowest id
            if (pos + 1 < m->T) m->inputs[b * m->T + pos + 1] = best;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/step%d.bin", dir, S);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(m->acts, sizeof(float), m->n_acts, f) != m->n_acts || fclose(f) != 0) {
            fprintf(stderr, "gpt2_port: cannot write %s\n", path);
            exit(1);
        }
    }
}

int main(int argc, char **argv) {
    int steps = argc == 6 && strcmp(argv[4], "--generate") == 0 ? atoi(argv[5]) : 0;
    if (argc != 4 && steps < 1) {
        fprintf(stderr, "usage: gpt2_port MODEL.bin STATE.bin OUT.bin [--generate N]\n");
        return 2;
    }
    Port m;
    load(&m, argv[1], argv[2], steps > 0 ? steps - 1 : 0);
    size_t n = (size_t)m.B * m.T;
    if (n < (size_t)4 * m.C) n = (size_t)4 * m.C;
    float *scratch = checked(malloc(2 * n * sizeof(float)));
    if (steps > 0) {
        generate(&m, steps, argv[3], scratch);
        return 0;
    }
    forward(&m, scratch);
    backward(&m, scratch);
    dump(&m, argv[3]);
    printf("mean loss %.9g\n", m.mean_loss);
    return 0;
}
