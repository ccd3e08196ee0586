"""The training template as one package: `train` is the loop, `config` its settings, `data`/`text` the datasets,
`models`/`gpt` the networks, `tasks` the losses, `checkpoint`/`distributed` resume and scale-out, `runlog` the
records; `troubleshoot` the doctor's checks and the fault drills. The scripts beside this folder run its commands."""
