"""``runner=bridge``: a trial as a short Megatron-Bridge training run. The trial as
ConfigContainer fields (``config``), the step recorder and log parsing (``measure``), the
CP proof on the model's attention modules (``verify``), that proof as a callback for
production runs (``guard``) and the run itself (``runner``). Job side: imports only the job
package and the contract; Bridge and TE lazily.
"""
