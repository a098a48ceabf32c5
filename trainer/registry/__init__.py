"""Registering a delivered model in the Vertex AI Model Registry (docs/serving.md,
"Registering the model"): the name and label rules, checked before anything is sent
(labels.py); what the delivered model says about itself (delivered_facts.py); the Vertex AI
SDK's upload (upload.py); the record that makes a second registration of the same model a
no-op (registration_record.py); and `register()`, the one call that does it all
(registration.py), for `python -m trainer.register` and the training chief alike."""
