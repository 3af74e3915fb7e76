# cython: language_level=3
"""The draft-length policy as the controller calls it (see ``_policy.pyx``)."""
from libcpp.vector cimport vector

cdef class DraftPolicy:
    cdef readonly int n_max
    cdef readonly bint adaptive
    cdef vector[double] t_verify     # EMA of a verify decode of k+1 rows (seconds)
    cdef vector[double] n_verify
    cdef vector[char] warmed         # lengths whose first verify (a new batch shape) was seen
    cdef vector[double] t_draft_cap  # EMA of a drafter call asked for c tokens (seconds)
    cdef vector[double] n_draft_cap
    cdef vector[double] ref_verify   # plain-round time (EMA) when t_verify[k] was measured
    cdef vector[double] ref_draft    # ... and when t_draft_cap[c] was
    cdef vector[double] n_alpha      # decayed trials of draft position i
    cdef vector[double] s_alpha      # decayed acceptances of draft position i
    cdef long rounds                 # the rounds it decided (a round shared by sequences: once)
    cdef long round_id               # the controller's id of the round ``cap`` last decided
    cdef int current                 # drafts verified in the last round
    cdef int last_cap                # tokens asked of the drafter in the last round
    cdef bint exploring              # this round verifies the least measured length
    cdef bint probing                # this round probes a drafter that does not pay
    cdef long probe_gap              # rounds between probes of a drafter that does not pay
    cdef long last_probe             # round of the last such probe (0: none yet)
    cdef double last_gain            # the best drafting rate over plain's, as cap() last saw it
    cdef long n_drafts_seen          # rounds that verified a draft
    # probes' measured cost: the last probe verified drafts and waits for its round's time
    # (``observe_round``), whether it paid; decayed loss (plain rounds' worth) of probe rounds
    cdef bint probe_open, probe_paid
    cdef double probe_loss, n_probe_loss
    # calibration: decayed sums of what drafting rounds yielded and cost, measured and as
    # the model predicted them (catch-up decodes and other costs the model leaves out)
    cdef double cal_tokens, cal_time, cal_tokens_predicted, cal_time_predicted, cal_rounds
    # the last choose(): the round's expected tokens and time (0: not measured yet)
    cdef readonly double predicted_tokens, predicted_time
    # the verify cost line of long drafts: decayed sums over verifies of k >= LINE_FROM drafts
    # of count, k, k^2, time in plain rounds, k * time; n_long counts them
    cdef double ln_n, ln_r, ln_rr, ln_t, ln_rt
    cdef long n_long
    cdef bint _line(self, double * a, double * b) noexcept
    cdef void _line_sample(self, int k, double t) noexcept
    cdef double _load_factor(self, double ref) noexcept
    cdef double _plain_time_now(self) noexcept
    cdef double _verify_measured(self, int k) noexcept
    cdef double _verify_time(self, int k) noexcept
    cdef double _verify_time_estimate(self, int k) noexcept
    cdef double _draft_time(self, int c) noexcept
    cdef double _alpha(self, int i) noexcept
    cdef double _alpha_after(self, int i, double prior) noexcept
    cdef double _expected_tokens(self, int k) noexcept
    cdef bint _drafting_nearly_free(self) noexcept
    cdef double _token_rate(self, int k) noexcept
    cdef int _best_cap(self, double * gain) noexcept
    cdef int _probe_cap(self) noexcept
    cpdef bint probes_new_requests(self)
    cpdef void restart_probes(self)
    cdef int cap(self, long round_id=*) noexcept
    cdef int _decide_cap(self) noexcept
    cdef int choose(self, int proposed, double t_drafted) noexcept
    cdef double p_stop(self) noexcept
    cdef bint _pays_if_all_accepted(self, int c) noexcept
    cdef void _probed(self, bint paid) noexcept
    cdef long _budget_gap(self) noexcept
    cdef void observe(self, int k, int a, double t_dec) noexcept
    cdef double _calibration(self) noexcept
    cdef void _predict(self, int k, double t_drafted) noexcept
    cdef void observe_round(self, double predicted_tokens, double predicted_time, int tokens,
                            double t, double t_caught=*) noexcept
    cdef void observe_draft_time(self, int cap, double t) noexcept


cdef class BatchCost:
    cdef double n, s_r, s_rr, s_t, s_rt    # decayed sums over batches: count, rows, rows^2, time, rows*time
    cpdef void observe(self, int rows, double t)
    cpdef double share(self, double t, int rows, int n_seqs, int rows_seq)
    cdef void _line(self, double * a, double * b) noexcept
